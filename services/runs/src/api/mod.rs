//! Thin tonic handlers: validate, convert proto ⇄ domain, call the domain modules.

pub mod convert;
pub mod runs;
pub mod threads;
