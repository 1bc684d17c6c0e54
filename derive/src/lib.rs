//! `#[derive(Module)]`: a kiln module's structure from its fields.
//!
//! Each field is one of (decided from its type, or an attribute):
//!
//! | field | becomes |
//! |---|---|
//! | `Tensor`, `Option<Tensor>` | a parameter (`Entry::Param`) under the field's name |
//! | `#[module(buffer)]` on one of those | a buffer (in the `state_dict`) |
//! | `#[module(buffer, persistent = false)]` | a non-persistent buffer (moved with the module, not saved) |
//! | `Training` | the module's train/eval flag (`is_training`, `set_own_training`) |
//! | `#[module(skip)]` | nothing (configuration: sizes, rates, flags) |
//! | `#[module(name = "self")]` on any of the above | registered under that name, not the field's (for PyTorch names that are no Rust field name: `self`, `LayerNorm`) |
//! | anything else | a child module: a `Module`, `Option<M>` or `Box<dyn Module>` |
//!
//! A field that is none of these (say a `usize` without `#[module(skip)]`,
//! or a `Vec<Linear>`, which would hide its parameters) is a compile error
//! that says what to do. The derived `Module::forward` calls the struct's
//! inherent `fn forward(&self, x: &Tensor) -> Result<Tensor>`; with
//! `#[module(forward_many)]` on the struct, `Module::forward_many` calls its
//! inherent `forward_many` too. A missing inherent `forward` is a compile
//! error naming `derive_Module_needs_an_inherent_fn_forward`, never an
//! endless recursion.
//!
//! `describe()` is the struct's name (`Net`), as PyTorch prints a custom
//! module above its children; `#[module(describe = "path::to::fn")]` names
//! a `fn(&Self) -> String` instead. `#[module(crate = "kiln_frontend")]`
//! points the generated code at another path than `::kiln`.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::{format_ident, quote};
use syn::{parse_macro_input, Data, DeriveInput, Fields, LitStr, Type};

#[proc_macro_derive(Module, attributes(module))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// What one field is to the module.
enum Role {
    Param { optional: bool },
    Buffer { optional: bool, persistent: bool },
    Training,
    Child,
    Skip,
}

#[derive(Default)]
struct StructAttrs {
    krate: Option<syn::Path>,
    describe: Option<syn::Path>,
    forward_many: bool,
}

fn struct_attrs(input: &DeriveInput) -> syn::Result<StructAttrs> {
    let mut out = StructAttrs::default();
    for a in input.attrs.iter().filter(|a| a.path().is_ident("module")) {
        a.parse_nested_meta(|m| {
            if m.path.is_ident("crate") {
                out.krate = Some(m.value()?.parse::<LitStr>()?.parse()?);
            } else if m.path.is_ident("describe") {
                out.describe = Some(m.value()?.parse::<LitStr>()?.parse()?);
            } else if m.path.is_ident("forward_many") {
                out.forward_many = true;
            } else {
                return Err(
                    m.error("expected `crate = \"..\"`, `describe = \"..\"` or `forward_many`")
                );
            }
            Ok(())
        })?;
    }
    Ok(out)
}

/// The last path segment of `ty` and its first generic argument, if any.
fn last_segment(ty: &Type) -> Option<(String, Option<&Type>)> {
    let Type::Path(p) = ty else { return None };
    let seg = p.path.segments.last()?;
    let arg = match &seg.arguments {
        syn::PathArguments::AngleBracketed(a) => a.args.iter().find_map(|g| match g {
            syn::GenericArgument::Type(t) => Some(t),
            _ => None,
        }),
        _ => None,
    };
    Some((seg.ident.to_string(), arg))
}

fn is_tensor(ty: &Type) -> bool {
    matches!(last_segment(ty), Some((n, None)) if n == "Tensor")
}

/// The field's role and the name it is registered under (`#[module(name = "..")]`, else its own).
fn field_role(f: &syn::Field, own_name: &str) -> syn::Result<(Role, String)> {
    let (mut buffer, mut persistent, mut skip) = (false, true, false);
    let mut name = own_name.to_string();
    for a in f.attrs.iter().filter(|a| a.path().is_ident("module")) {
        a.parse_nested_meta(|m| {
            if m.path.is_ident("buffer") {
                buffer = true;
            } else if m.path.is_ident("persistent") {
                persistent = m.value()?.parse::<syn::LitBool>()?.value;
            } else if m.path.is_ident("skip") {
                skip = true;
            } else if m.path.is_ident("name") {
                name = m.value()?.parse::<LitStr>()?.value();
            } else {
                return Err(
                    m.error("expected `buffer`, `persistent = false`, `skip` or `name = \"..\"`")
                );
            }
            Ok(())
        })?;
    }
    if skip {
        return Ok((Role::Skip, name));
    }
    let tensor = match last_segment(&f.ty) {
        Some((n, Some(inner))) if n == "Option" && is_tensor(inner) => Some(true),
        _ if is_tensor(&f.ty) => Some(false),
        _ => None,
    };
    let role = match (tensor, buffer) {
        (Some(optional), false) => Role::Param { optional },
        (Some(optional), true) => Role::Buffer {
            optional,
            persistent,
        },
        (None, true) => {
            return Err(syn::Error::new_spanned(
                &f.ty,
                "#[module(buffer)] goes on a `Tensor` or `Option<Tensor>` field",
            ))
        }
        (None, false) if matches!(last_segment(&f.ty), Some((n, None)) if n == "Training") => {
            Role::Training
        }
        (None, false) => Role::Child,
    };
    Ok((role, name))
}

fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let attrs = struct_attrs(input)?;
    let krate = attrs
        .krate
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(::kiln));
    let nn = quote!(#krate::nn);
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            &input.ident,
            "#[derive(Module)] works on structs",
        ));
    };
    let fields: Vec<(Tokens, String, &syn::Field)> = match &data.fields {
        Fields::Named(named) => named
            .named
            .iter()
            .map(|f| {
                let id = f.ident.as_ref().expect("named field");
                (quote!(#id), id.to_string(), f)
            })
            .collect(),
        Fields::Unnamed(unnamed) => unnamed
            .unnamed
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let id = syn::Index::from(i);
                (quote!(#id), i.to_string(), f)
            })
            .collect(),
        Fields::Unit => vec![],
    };
    let (mut visit, mut visit_mut) = (vec![], vec![]);
    let mut training = None;
    for (access, own_name, f) in &fields {
        let (role, name) = field_role(f, own_name)?;
        let (kind, optional) = match role {
            Role::Skip => continue,
            Role::Training => {
                if training.is_some() {
                    return Err(syn::Error::new_spanned(f, "only one `Training` field"));
                }
                training = Some(access.clone());
                continue;
            }
            Role::Child => {
                let ty = &f.ty;
                visit.push(quote! {
                    if let Some(c) = <#ty as #nn::ModuleField>::child(&self.#access) {
                        f(#nn::Entry::Child(#name, c));
                    }
                });
                visit_mut.push(quote! {
                    if let Some(c) = <#ty as #nn::ModuleField>::child_mut(&mut self.#access) {
                        f(#nn::EntryMut::Child(#name, c));
                    }
                });
                continue;
            }
            Role::Param { optional } => (format_ident!("Param"), optional),
            Role::Buffer {
                optional,
                persistent: true,
            } => (format_ident!("Buffer"), optional),
            Role::Buffer {
                optional,
                persistent: false,
            } => (format_ident!("TransientBuffer"), optional),
        };
        if optional {
            visit.push(quote! {
                if let Some(t) = &self.#access { f(#nn::Entry::#kind(#name, t)); }
            });
            visit_mut.push(quote! {
                if let Some(t) = &mut self.#access { f(#nn::EntryMut::#kind(#name, t)); }
            });
        } else {
            visit.push(quote!(f(#nn::Entry::#kind(#name, &self.#access));));
            visit_mut.push(quote!(f(#nn::EntryMut::#kind(#name, &mut self.#access));));
        }
    }
    let ident = &input.ident;
    let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
    let describe = match &attrs.describe {
        Some(p) => quote!(#p(self)),
        None => {
            let s = ident.to_string();
            quote!(::std::string::String::from(#s))
        }
    };
    let training_fns = training.map(|t| {
        quote! {
            fn set_own_training(&self, on: bool) { self.#t.set(on) }
            fn is_training(&self) -> bool { self.#t.get() }
        }
    });
    let forward_many = attrs.forward_many.then(|| {
        quote! {
            fn forward_many(
                &self,
                inputs: &[::std::option::Option<&#krate::Tensor>],
            ) -> #krate::Result<::std::vec::Vec<#krate::Tensor>> {
                #[allow(non_camel_case_types, dead_code)]
                trait derive_Module_needs_an_inherent_fn_forward_many {
                    fn forward_many(&self, _: ()) {}
                }
                impl<T: ?Sized> derive_Module_needs_an_inherent_fn_forward_many for T {}
                Self::forward_many(self, inputs)
            }
        }
    });
    Ok(quote! {
        impl #impl_g #nn::Module for #ident #ty_g #where_g {
            // `Self::forward` is the struct's inherent method, which wins
            // over every trait method. Without one it would name this very
            // method (endless recursion); the local trait makes that case
            // ambiguous or ill-typed instead: a compile error naming it.
            fn forward(&self, x: &#krate::Tensor) -> #krate::Result<#krate::Tensor> {
                #[allow(non_camel_case_types, dead_code)]
                trait derive_Module_needs_an_inherent_fn_forward {
                    fn forward(&self, _: ()) {}
                }
                impl<T: ?Sized> derive_Module_needs_an_inherent_fn_forward for T {}
                Self::forward(self, x)
            }
            #forward_many
            fn visit<'a>(&'a self, f: &mut dyn FnMut(#nn::Entry<'a>)) {
                #(#visit)*
            }
            fn visit_mut(&mut self, f: &mut dyn FnMut(#nn::EntryMut<'_>)) {
                #(#visit_mut)*
            }
            fn describe(&self) -> ::std::string::String {
                #describe
            }
            #training_fns
        }
    })
}
