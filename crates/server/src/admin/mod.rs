//! Health, readiness, metrics, the console and the OpenAPI document.

pub mod console;
pub mod metrics;
pub mod openapi;
