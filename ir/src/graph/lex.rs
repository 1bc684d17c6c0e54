//! Tokens of the graph text form, each with its line and column (1-based).

use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// `relu`, `f32`, `fc1.weight`, `true`, `inf`
    Ident(String),
    /// `3`, `-1`, `0.5`, `1e-5`, `-inf`
    Num(String),
    /// `%3` (the text after `%`)
    Val(String),
    /// `"a name"` (unescaped)
    Str(String),
    /// one of `( ) { } [ ] , : =`
    Punct(char),
    Eof,
}

impl Tok {
    pub fn describe(&self) -> String {
        match self {
            Tok::Ident(s) | Tok::Num(s) => format!("'{s}'"),
            Tok::Val(s) => format!("'%{s}'"),
            Tok::Str(s) => format!("{s:?}"),
            Tok::Punct(c) => format!("'{c}'"),
            Tok::Eof => "end of input".into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pos {
    pub line: u32,
    pub col: u32,
}

impl Pos {
    pub fn error(self, msg: impl std::fmt::Display) -> Error {
        Error::op(
            "parse",
            format!("line {}, column {}: {msg}", self.line, self.col),
        )
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub tok: Tok,
    pub pos: Pos,
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.'
}

pub(crate) fn lex(text: &str) -> Result<Vec<Token>> {
    let cs: Vec<char> = text.chars().collect();
    let (mut i, mut line, mut col) = (0usize, 1u32, 1u32);
    let mut out = Vec::new();
    // advances over `n` chars, tracking line and column
    let bump = |i: &mut usize, n: usize, line: &mut u32, col: &mut u32| {
        for _ in 0..n {
            if cs[*i] == '\n' {
                *line += 1;
                *col = 1;
            } else {
                *col += 1;
            }
            *i += 1;
        }
    };
    while i < cs.len() {
        let c = cs[i];
        let pos = Pos { line, col };
        let next = cs.get(i + 1).copied();
        if c.is_whitespace() {
            bump(&mut i, 1, &mut line, &mut col);
            continue;
        }
        if c == '/' && next == Some('/') {
            let n = cs[i..].iter().take_while(|&&c| c != '\n').count();
            bump(&mut i, n, &mut line, &mut col);
            continue;
        }
        let (tok, len) = if "(){}[],:=".contains(c) {
            (Tok::Punct(c), 1)
        } else if c.is_ascii_digit()
            || (c == '-' && next.is_some_and(|n| n.is_ascii_digit() || n == 'i'))
        {
            let mut j = i + 1;
            while j < cs.len()
                && (ident_char(cs[j])
                    || ((cs[j] == '-' || cs[j] == '+') && matches!(cs[j - 1], 'e' | 'E')))
            {
                j += 1;
            }
            (Tok::Num(cs[i..j].iter().collect()), j - i)
        } else if c == '%' {
            let n = cs[i + 1..].iter().take_while(|&&c| ident_char(c)).count();
            if n == 0 {
                return Err(pos.error("expected a value name after '%'"));
            }
            (Tok::Val(cs[i + 1..i + 1 + n].iter().collect()), n + 1)
        } else if c.is_ascii_alphabetic() || c == '_' {
            let n = cs[i..].iter().take_while(|&&c| ident_char(c)).count();
            (Tok::Ident(cs[i..i + n].iter().collect()), n)
        } else if c == '"' {
            let (s, n) = string(&cs[i..]).map_err(|m| pos.error(m))?;
            (Tok::Str(s), n)
        } else {
            return Err(pos.error(format!("unexpected character {c:?}")));
        };
        out.push(Token { tok, pos });
        bump(&mut i, len, &mut line, &mut col);
    }
    out.push(Token {
        tok: Tok::Eof,
        pos: Pos { line, col },
    });
    Ok(out)
}

/// A quoted string at the start of `cs` with Rust's escapes (as `{:?}` writes
/// them): the text and how many chars it spans.
fn string(cs: &[char]) -> std::result::Result<(String, usize), String> {
    let mut s = String::new();
    let mut j = 1;
    loop {
        match cs.get(j) {
            None | Some('\n') => return Err("unterminated string".into()),
            Some('"') => return Ok((s, j + 1)),
            Some('\\') => {
                let e = cs.get(j + 1).copied();
                j += 2;
                s.push(match e {
                    Some('n') => '\n',
                    Some('t') => '\t',
                    Some('r') => '\r',
                    Some('0') => '\0',
                    Some(c @ ('\\' | '"' | '\'')) => c,
                    Some('u') if cs.get(j) == Some(&'{') => {
                        let n = cs[j..].iter().take_while(|&&c| c != '}').count();
                        let hex: String = cs[j + 1..(j + n).min(cs.len())].iter().collect();
                        j += n + 1;
                        u32::from_str_radix(&hex, 16)
                            .ok()
                            .and_then(char::from_u32)
                            .ok_or_else(|| format!("bad escape \\u{{{hex}}}"))?
                    }
                    other => return Err(format!("unknown escape \\{}", other.unwrap_or(' '))),
                });
            }
            Some(&c) => {
                s.push(c);
                j += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        lex(s).unwrap().into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn tokens() {
        use Tok::*;
        assert_eq!(
            toks("%3 = f(%x) {eps=1e-5, d=-1, m=-inf} // note\n\"a b\\\"\""),
            vec![
                Val("3".into()),
                Punct('='),
                Ident("f".into()),
                Punct('('),
                Val("x".into()),
                Punct(')'),
                Punct('{'),
                Ident("eps".into()),
                Punct('='),
                Num("1e-5".into()),
                Punct(','),
                Ident("d".into()),
                Punct('='),
                Num("-1".into()),
                Punct(','),
                Ident("m".into()),
                Punct('='),
                Num("-inf".into()),
                Punct('}'),
                Str("a b\"".into()),
                Eof
            ]
        );
        let e = lex("graph g {\n  %1 = ?").unwrap_err();
        assert_eq!(
            e.to_string(),
            "parse: line 2, column 8: unexpected character '?'"
        );
    }
}
