//! Query-string and header helpers shared by the handlers.

use crate::error::ApiError;
use gapless_protocol::codes::ErrorCode;
use utoipa::ToSchema;

/// A parsed query string: every `key=value` pair in order (keys may repeat).
#[derive(Debug)]
pub struct Query(pub Vec<(String, String)>);

impl Query {
    /// Parses a raw query string (`None` = empty).
    pub fn parse(raw: Option<&str>) -> Self {
        Query(
            form_urlencoded::parse(raw.unwrap_or("").as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `key`, in order.
    pub fn all(&self, key: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// A boolean parameter: absent is `false`; `true`/`false`/`1`/`0` accepted.
    ///
    /// # Errors
    /// 400 `invalid_request` for any other value.
    pub fn flag(&self, key: &str) -> Result<bool, ApiError> {
        match self.get(key) {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") | Some("") => Ok(true),
            Some(v) => Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!("query parameter {key}={v:?} must be true or false"),
            )),
        }
    }
}

/// A query flag: `true` or `false`; `1`, `0` and an empty value (the bare
/// name, meaning true) are accepted too.
//
// (Not in the document:) what `Query::flag` accepts.
#[derive(ToSchema)]
#[schema(as = Flag)]
#[allow(dead_code)]
pub(crate) enum Flag {
    #[schema(rename = "true")]
    True,
    #[schema(rename = "false")]
    False,
    #[schema(rename = "1")]
    One,
    #[schema(rename = "0")]
    Zero,
    #[schema(rename = "")]
    Empty,
}
