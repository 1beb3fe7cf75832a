//! Thin tonic handlers: validate, convert proto ⇄ domain, call the domain modules.

pub mod convert;
pub mod run_service;
pub mod thread_service;
