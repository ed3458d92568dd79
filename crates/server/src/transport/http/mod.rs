//! Publish, history and sessions over plain HTTP.

pub mod history;
pub mod publish;
pub mod sessions;
