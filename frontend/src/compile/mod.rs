//! `compile()`: trace eager code into an `ir::Graph`, rewrite and fuse it,
//! and run the result as a cached executable under guards.

pub mod dispatch;
pub mod trace;
