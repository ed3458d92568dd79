//! Authorization: who may read or write which channel or session
//! (`docs/security.md`).
//!
//! With no key configured the server runs open: every request holds a
//! [`Grant`] that allows everything. With a key, every request must present
//! a JWT (read by [`Auth::token_of`]: the `Authorization: Bearer` header, the
//! `gapless_token` cookie, or the `access_token` query parameter, first found
//! wins), verified by [`Auth::verify`] into a [`Grant`]; handlers then ask the
//! grant with [`Grant::require`] before they touch the hub, so a refusal
//! never depends on whether a channel exists.
//!
//! What a token allows is its one claim `gapless`:
//! `{"subscribe": [pattern…], "publish": [pattern…]}`. A pattern is a name, a
//! prefix followed by one `*` at its end (`rooms:*` matches `rooms:42` and
//! `rooms:`, not `room`), or `*` alone (everything). Sessions are named
//! `session/ID` in patterns (`/` is outside the channel alphabet, so no
//! channel can take a session's name): producers need `publish` on it,
//! consumers `subscribe`.
//!
//! A namespace with `public = true` (its table in the configuration file,
//! `gapless_core::namespace`) lets anyone follow and read its channels:
//! every grant allows `subscribe` on them ([`PublicReads`]), and a request
//! with no token at all gets an anonymous grant that allows only that, whose
//! refusals are 401 (present a token) rather than 403. Publishing still
//! needs a token that allows it.
//!
//! The bottom part: it may use `config`, `error` and `App` from the top,
//! and no other part (`tests/layers.rs`).

pub mod origin;

use crate::error::ApiError;
use crate::App;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use gapless_core::namespace::Namespaces;
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::object::Object;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Name of the cookie a browser may carry its token in.
pub(crate) const COOKIE: &str = "gapless_token";
/// Name of the query parameter that may carry a token (for clients that can
/// set neither a header nor a cookie; it can land in access logs).
pub(crate) const QUERY: &str = "access_token";
/// Shortest accepted HS256 secret, in bytes (RFC 7518 section 3.2: a key at
/// least as long as the hash output).
pub const MIN_SECRET_BYTES: usize = 32;
/// The prefix of a session's name in patterns: `session/ID`.
pub(crate) const SESSION_PREFIX: &str = "session/";

/// Token settings: the `--jwt-*` flags of `gapless serve`.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// HS256 shared secret (`--jwt-secret`, `--jwt-secret-file`); `None`: no HMAC key.
    pub secret: Option<Vec<u8>>,
    /// PEM file of an RSA (RS256) or EC P-256 (ES256) public key (`--jwt-public-key`).
    pub public_key: Option<PathBuf>,
    /// Clock skew allowed on `exp` and `nbf`, in milliseconds (`--jwt-leeway-ms`).
    /// A token is honoured until `exp` plus this; default 5000.
    pub leeway_ms: u64,
    /// When set, a token's `aud` must contain this (`--jwt-audience`).
    pub audience: Option<String>,
    /// When set, a token's `iss` must be this (`--jwt-issuer`).
    pub issuer: Option<String>,
}

/// A key a token may verify with.
struct Key {
    key: DecodingKey,
    validation: Validation,
}

/// The verifier: the configured keys (none: the server is open).
pub struct Auth {
    keys: Vec<Key>,
    leeway_ms: u64,
    /// What every request may do on an open server (shared, not rebuilt per request).
    open: Arc<Grant>,
    /// The channels every grant may read ([`Auth::public_reads`]).
    public: PublicReads,
    /// What a request without a token may do when some namespace is
    /// public (`None`: such a request is refused).
    anonymous: Option<Arc<Grant>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("keys", &self.keys.len())
            .field("leeway_ms", &self.leeway_ms)
            .finish()
    }
}

/// Why the token settings cannot be used (at startup).
#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    /// The public key file could not be read.
    #[error("reading the public key {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What failed.
        error: std::io::Error,
    },
    /// The file is not a PEM RSA or EC public key.
    #[error("{path} is not a PEM public key of RSA (RS256) or EC P-256 (ES256) type: {error}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        error: String,
    },
    /// The secret is empty.
    #[error("the JWT secret is too short: HS256 needs at least 32 bytes (RFC 7518 section 3.2); make one with `head -c 32 /dev/urandom | base64`")]
    EmptySecret,
}

impl Auth {
    /// An open server: every request may do everything.
    pub fn open() -> Self {
        Auth {
            keys: Vec::new(),
            leeway_ms: 0,
            open: Arc::new(Grant::all()),
            public: PublicReads::default(),
            anonymous: None,
        }
    }

    /// Lets anyone follow and read the channels of the namespaces with
    /// `public = true` in `namespaces` (nothing changes when none is, or on
    /// an open server, where everyone may read everything already): every
    /// grant allows `subscribe` on them, and a request without a token is
    /// allowed that and nothing else.
    pub fn public_reads(mut self, namespaces: Arc<Namespaces>) -> Self {
        if self.is_open() || !namespaces.any_public() {
            return self;
        }
        self.public = PublicReads(Some(namespaces));
        self.anonymous = Some(Arc::new(Grant {
            subject: None,
            subscribe: Patterns::default(),
            publish: Patterns::default(),
            expires_ms: None,
            public: self.public.clone(),
            anonymous: true,
        }));
        self
    }

    /// A verifier for `config`; open when it names no key.
    ///
    /// # Errors
    /// [`AuthSetupError`] for an unreadable or unusable key.
    pub fn new(config: &AuthConfig) -> Result<Self, AuthSetupError> {
        let mut keys = Vec::new();
        if let Some(secret) = &config.secret {
            if secret.len() < MIN_SECRET_BYTES {
                return Err(AuthSetupError::EmptySecret);
            }
            keys.push(Key {
                key: DecodingKey::from_secret(secret).map_err(|e| AuthSetupError::Key {
                    path: PathBuf::from("--jwt-secret"),
                    error: e.to_string(),
                })?,
                validation: validation(Algorithm::HS256, config),
            });
        }
        if let Some(path) = &config.public_key {
            let pem = std::fs::read(path).map_err(|error| AuthSetupError::Read {
                path: path.clone(),
                error,
            })?;
            let key = match DecodingKey::from_rsa_pem(&pem) {
                Ok(k) => Key {
                    key: k,
                    validation: validation(Algorithm::RS256, config),
                },
                Err(rsa) => match DecodingKey::from_ec_pem(&pem) {
                    Ok(k) => Key {
                        key: k,
                        validation: validation(Algorithm::ES256, config),
                    },
                    Err(ec) => {
                        return Err(AuthSetupError::Key {
                            path: path.clone(),
                            error: format!("as RSA: {rsa}; as EC: {ec}"),
                        })
                    }
                },
            };
            keys.push(key);
        }
        Ok(Auth {
            keys,
            leeway_ms: config.leeway_ms,
            open: Arc::new(Grant::all()),
            public: PublicReads::default(),
            anonymous: None,
        })
    }

    /// True when no key is configured: every request is allowed everything.
    pub fn is_open(&self) -> bool {
        self.keys.is_empty()
    }

    /// The token a request presents: `Authorization: Bearer`, else the
    /// [`COOKIE`] cookie, else the [`QUERY`] parameter of `query`.
    ///
    /// # Errors
    /// 401 for an `Authorization` header that is not `Bearer <token>`.
    pub fn token_of(headers: &HeaderMap, query: Option<&str>) -> Result<Option<String>, ApiError> {
        if let Some(v) = headers.get(axum::http::header::AUTHORIZATION) {
            let v = v.to_str().unwrap_or("");
            let token = v
                .split_once(' ')
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, t)| t.trim())
                .filter(|t| !t.is_empty());
            return match token {
                Some(t) => Ok(Some(t.to_owned())),
                None => Err(unauthorized(
                    "the Authorization header must be `Bearer <token>`",
                    true,
                )),
            };
        }
        for v in headers.get_all(axum::http::header::COOKIE) {
            let Ok(v) = v.to_str() else { continue };
            for c in cookie::Cookie::split_parse(v).flatten() {
                if c.name() == COOKIE && !c.value().is_empty() {
                    return Ok(Some(c.value().to_owned()));
                }
            }
        }
        Ok(form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .find(|(k, v)| k == QUERY && !v.is_empty())
            .map(|(_, v)| v.into_owned()))
    }

    /// What the request with `headers` and `query` may do.
    ///
    /// # Errors
    /// 401 `unauthorized` when the server has keys and the request presents
    /// no token or one that fails verification.
    pub fn grant_of(
        &self,
        headers: &HeaderMap,
        query: Option<&str>,
    ) -> Result<Arc<Grant>, ApiError> {
        if self.is_open() {
            return Ok(self.open.clone());
        }
        self.grant_of_token(Self::token_of(headers, query)?)
    }

    /// Whether the token [`Auth::token_of`] finds in `headers` is the
    /// [`COOKIE`] cookie: no `Authorization` header, and the cookie set.
    /// A browser sends the cookie with any page's request, whatever the
    /// page's origin (`origin::foreign_page` tells which pages may use it).
    pub fn cookie_is_credential(headers: &HeaderMap) -> bool {
        !headers.contains_key(axum::http::header::AUTHORIZATION)
            && matches!(Self::token_of(headers, None), Ok(Some(_)))
    }

    /// What a request may do on the token of its [`QUERY`] parameter alone,
    /// its `Authorization` header and cookie ignored.
    ///
    /// # Errors
    /// As [`Auth::grant_of`].
    pub fn grant_of_query(&self, query: Option<&str>) -> Result<Arc<Grant>, ApiError> {
        self.grant_of(&HeaderMap::new(), query)
    }

    /// What `token` (none: no token presented) may do on a server with keys:
    /// without one, only reading the public namespaces' channels, if any.
    fn grant_of_token(&self, token: Option<String>) -> Result<Arc<Grant>, ApiError> {
        match (token, &self.anonymous) {
            (None, Some(anonymous)) => Ok(anonymous.clone()),
            (None, None) => Err(unauthorized(
                "this server requires a token: send `Authorization: Bearer <token>`, \
                 the gapless_token cookie, or ?access_token=",
                false,
            )),
            (Some(t), _) => self
                .verify(&t, gapless_core::journal::now_ms())
                .map(Arc::new),
        }
    }

    /// Verifies `token` at `now_ms` (Unix milliseconds): signature with any
    /// configured key, `exp` required and `nbf` honoured with the leeway,
    /// `aud` and `iss` when configured, and the `gapless` claim's shape.
    ///
    /// # Errors
    /// 401 `unauthorized` saying what is wrong.
    pub fn verify(&self, token: &str, now_ms: u64) -> Result<Grant, ApiError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| unauthorized(&header_refusal(token, &self.algorithms(), &e), true))?;
        if let Some(why) = header_json(token).and_then(|h| critical(&h)) {
            return Err(unauthorized(&why, true));
        }
        let mut last = None;
        for k in self
            .keys
            .iter()
            .filter(|k| k.validation.algorithms.contains(&header.alg))
        {
            // Claims are a JSON object (RFC 7519 section 7.2), read one claim
            // at a time so a refusal names the claim at fault (`Claims::read`).
            match jsonwebtoken::decode::<Map<String, Value>>(token, &k.key, &k.validation) {
                Ok(data) => {
                    let claims = Claims::read(data.claims).map_err(|e| unauthorized(&e, true))?;
                    return self.grant(claims, now_ms);
                }
                Err(e) => last = Some(e),
            }
        }
        let why = match last.as_ref().map(jsonwebtoken::errors::Error::kind) {
            None => format!(
                "the token is signed with {:?}, which no configured key verifies; this server \
                 accepts {}",
                header.alg,
                self.accepted()
            ),
            Some(jsonwebtoken::errors::ErrorKind::InvalidSignature) => {
                "the token's signature does not verify".to_owned()
            }
            Some(jsonwebtoken::errors::ErrorKind::MissingRequiredClaim(c)) => {
                format!(
                    "the token has no valid `{c}` claim, which this server requires: {}",
                    claim_shape(c)
                )
            }
            Some(jsonwebtoken::errors::ErrorKind::InvalidClaimFormat(c)) => {
                format!("the token's `{c}` claim is malformed: {}", claim_shape(c))
            }
            Some(jsonwebtoken::errors::ErrorKind::InvalidAudience) => {
                "the token's `aud` does not name this server (--jwt-audience)".to_owned()
            }
            Some(jsonwebtoken::errors::ErrorKind::InvalidIssuer) => {
                "the token's `iss` is not the expected issuer (--jwt-issuer)".to_owned()
            }
            // The claims are read as a map: only a payload that is not a JSON
            // object fails here.
            Some(jsonwebtoken::errors::ErrorKind::Json(e)) => format!(
                "the token's payload is not a JSON object of claims (RFC 7519 section 7.2): {e}"
            ),
            Some(
                jsonwebtoken::errors::ErrorKind::InvalidToken
                | jsonwebtoken::errors::ErrorKind::Base64(_)
                | jsonwebtoken::errors::ErrorKind::Utf8(_),
            ) => malformed_part(token).unwrap_or(NOT_A_JWT).to_owned(),
            Some(other) => format!("the token does not verify: {other:?}"),
        };
        Err(unauthorized(&why, true))
    }

    fn grant(&self, claims: Claims, now_ms: u64) -> Result<Grant, ApiError> {
        let exp_ms = seconds_to_ms(claims.exp);
        if now_ms > exp_ms.saturating_add(self.leeway_ms) {
            return Err(unauthorized("the token has expired", true));
        }
        if let Some(nbf) = claims.nbf {
            if now_ms.saturating_add(self.leeway_ms) < seconds_to_ms(nbf) {
                return Err(unauthorized("the token is not valid yet (nbf)", true));
            }
        }
        let rights = claims.gapless.unwrap_or_default();
        let parse = |list: Vec<String>, what: &str| {
            list.into_iter()
                .map(|p| Pattern::parse(&p))
                .collect::<Result<Vec<_>, _>>()
                .map(Patterns)
                .map_err(|e| unauthorized(&format!("gapless.{what}: {e}"), true))
        };
        Ok(Grant {
            subject: claims.sub,
            subscribe: parse(rights.subscribe, "subscribe")?,
            publish: parse(rights.publish, "publish")?,
            expires_ms: Some(exp_ms.saturating_add(self.leeway_ms)),
            public: self.public.clone(),
            anonymous: false,
        })
    }
}

fn validation(alg: Algorithm, config: &AuthConfig) -> Validation {
    let mut v = Validation::new(alg);
    // exp and nbf are checked in `Auth::grant`, in milliseconds, with the
    // configured leeway; the crate checks presence, signature, aud and iss.
    v.validate_exp = false;
    v.validate_nbf = false;
    v.leeway = 0;
    let mut required = vec!["exp"];
    match &config.audience {
        Some(a) => {
            v.set_audience(&[a]);
            required.push("aud");
        }
        None => v.validate_aud = false,
    }
    if let Some(i) = &config.issuer {
        v.set_issuer(&[i]);
        required.push("iss");
    }
    v.set_required_spec_claims(&required);
    v
}

fn seconds_to_ms(s: f64) -> u64 {
    if s.is_finite() && s > 0.0 {
        (s * 1000.0).min(u64::MAX as f64) as u64
    } else {
        0
    }
}

impl Auth {
    /// The algorithms of the configured keys (`HS256`, `RS256`, `ES256`).
    fn algorithms(&self) -> Vec<String> {
        self.keys
            .iter()
            .flat_map(|k| k.validation.algorithms.iter().map(|a| format!("{a:?}")))
            .collect()
    }

    /// [`Auth::algorithms`] for a refusal's message: "only HS256 or ES256".
    fn accepted(&self) -> String {
        accepted_text(&self.algorithms())
    }
}

fn accepted_text(names: &[String]) -> String {
    match names {
        [] => "no signed token (no key is configured)".to_owned(),
        [one] => format!("only {one}"),
        [rest @ .., last] => format!("only {} or {last}", rest.join(", ")),
    }
}

/// Why `token`'s header could not be read (`error`: jsonwebtoken's), said
/// for a person: not three parts of base64url; a header that is not a JSON
/// object; a `crit` list of extensions this server does not understand (RFC
/// 7515 section 4.1.11 requires refusing it); an `alg` this server does not
/// take (`none` above all). Only the `accepted` algorithms are named.
fn header_refusal(token: &str, accepted: &[String], error: &jsonwebtoken::errors::Error) -> String {
    let header = match header_json(token) {
        None => return NOT_A_JWT.to_owned(),
        Some(Value::Object(header)) => header,
        Some(_) => {
            return "the token's header is not a JSON object (RFC 7515 section 4)".to_owned()
        }
    };
    let list = accepted_text(accepted);
    if let Some(why) = critical(&Value::Object(header.clone())) {
        return why;
    }
    match header.get("alg") {
        None => format!(
            "the token's header has no `alg` (RFC 7515 section 4.1.1); this server accepts {list}"
        ),
        Some(Value::String(alg)) if alg.eq_ignore_ascii_case("none") => format!(
            "the token's header says `alg` none: an unsigned token (RFC 7519 section 6) is \
             never accepted; this server accepts {list}"
        ),
        Some(Value::String(alg)) if accepted.contains(alg) => {
            format!("the token's header is not one this server reads: {error}")
        }
        Some(alg) => {
            format!("the token is signed with {alg}, which this server does not accept; it accepts {list}")
        }
    }
}

/// The JSON of `token`'s header: `None` unless the token is three parts of
/// which the first is base64url of JSON.
fn header_json(token: &str) -> Option<Value> {
    use base64::Engine;
    let mut parts = token.split('.');
    let (Some(first), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(first)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The refusal of a header that asks for what this server does not do:
/// critical extensions (`crit`, RFC 7515 section 4.1.11: a recipient that
/// does not understand them must refuse the token) or an unencoded payload
/// (`b64`, RFC 7797). `None` for any other header.
fn critical(header: &Value) -> Option<String> {
    if let Some(crit) = header.get("crit") {
        return Some(format!(
            "the token's header lists critical extensions (`crit`: {crit}), which this server \
             does not understand, so it must refuse the token (RFC 7515 section 4.1.11); \
             sign tokens without `crit`"
        ));
    }
    if header.get("b64").is_some() {
        return Some(
            "the token's header has `b64` (an unencoded payload, RFC 7797), which this server \
             does not accept; sign tokens without it"
                .to_owned(),
        );
    }
    None
}

/// The refusal of a token that is not a JWT at all.
const NOT_A_JWT: &str =
    "the token is not a JWT: three base64url parts separated by dots (RFC 7519 section 3)";

/// Which part of a token of three parts (its header already read) is not
/// what RFC 7515 section 2 says it is: base64url without padding (which
/// also refuses a last character with bits left over, as a signature
/// changed by hand has), the payload of UTF-8. `None` when the token is
/// not three parts.
fn malformed_part(token: &str) -> Option<&'static str> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = token.split('.').collect();
    let [_, payload, signature] = parts.as_slice() else {
        return None;
    };
    match b64.decode(payload) {
        Err(_) => {
            return Some("the token is a JWT whose payload is not base64url (RFC 7515 section 2)")
        }
        Ok(bytes) if std::str::from_utf8(&bytes).is_err() => {
            return Some("the token is a JWT whose payload is not UTF-8 (RFC 7519 section 7.2)")
        }
        Ok(_) => {}
    }
    b64.decode(signature).err().map(|_| {
        "the token is a JWT whose signature is malformed: not base64url without padding \
         (RFC 7515 section 2)"
    })
}

/// What each claim gapless reads must hold, for a refusal's message.
fn claim_shape(claim: &str) -> &'static str {
    match claim {
        "exp" => "a number of seconds since 1970 (RFC 7519 section 4.1.4)",
        "nbf" => "a number of seconds since 1970 (RFC 7519 section 4.1.5), or left out",
        "aud" => {
            "a string, or an array of strings, naming this server (--jwt-audience; \
             RFC 7519 section 4.1.3)"
        }
        "iss" => "the string this server expects (--jwt-issuer; RFC 7519 section 4.1.1)",
        "sub" => "a string (RFC 7519 section 4.1.2), or left out",
        "gapless" => {
            "an object {\"subscribe\": [pattern], \"publish\": [pattern]} (either list \
             may be left out), or the claim left out"
        }
        _ => "see docs/security.md",
    }
}

/// The claims gapless reads; others are ignored.
#[derive(Debug)]
struct Claims {
    exp: f64,
    nbf: Option<f64>,
    sub: Option<String>,
    gapless: Option<Rights>,
}

impl Claims {
    /// Reads the claims gapless uses from the payload `map`, one at a time.
    /// A claim that is left out is absent; one that is present must have its
    /// type (`null` is not a left-out claim: `"gapless": null` is refused,
    /// as docs/security.md says of a `gapless` claim that is not an object).
    ///
    /// # Errors
    /// What is wrong, naming the claim.
    fn read(mut map: Map<String, Value>) -> Result<Claims, String> {
        fn claim<T: serde::de::DeserializeOwned>(
            map: &mut Map<String, Value>,
            name: &str,
        ) -> Result<Option<T>, String> {
            match map.remove(name) {
                None => Ok(None),
                Some(v) => serde_json::from_value(v).map(Some).map_err(|e| {
                    format!(
                        "the token's `{name}` claim is malformed ({e}): it must be {}",
                        claim_shape(name)
                    )
                }),
            }
        }
        let exp = claim::<f64>(&mut map, "exp")?.ok_or_else(|| {
            format!(
                "the token has no `exp` claim, which this server requires: {}",
                claim_shape("exp")
            )
        })?;
        Ok(Claims {
            exp,
            nbf: claim(&mut map, "nbf")?,
            sub: claim(&mut map, "sub")?,
            // An object only: serde's derive would also take the lists by position.
            gapless: claim::<Object<Rights>>(&mut map, "gapless")?.map(Object::into_inner),
        })
    }
}

/// The `gapless` claim, exactly this shape (an object: read through [`Object`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rights {
    #[serde(default)]
    subscribe: Vec<String>,
    #[serde(default)]
    publish: Vec<String>,
}

/// A 401 answer. `invalid` says a token was presented and failed (RFC 6750
/// section 3.1 `invalid_token`) rather than missing.
pub(crate) fn unauthorized(message: &str, invalid: bool) -> ApiError {
    let mut e = ApiError::new(ErrorCode::Unauthorized, message);
    if invalid {
        e = e.with("token_error", "invalid_token");
    }
    e
}

/// One pattern of a token's `subscribe` or `publish` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// Exactly this name.
    Exact(String),
    /// Any name that starts with this.
    Prefix(String),
    /// Every name (`*`).
    All,
}

impl Pattern {
    /// Parses a pattern: a name, a prefix ending in one `*`, or `*`.
    ///
    /// # Errors
    /// A `*` anywhere but at the end, or an empty pattern.
    pub fn parse(p: &str) -> Result<Pattern, String> {
        match p.find('*') {
            _ if p.is_empty() => Err("a pattern is empty".to_owned()),
            None => Ok(Pattern::Exact(p.to_owned())),
            Some(i) if i + 1 == p.len() => Ok(if i == 0 {
                Pattern::All
            } else {
                Pattern::Prefix(p[..i].to_owned())
            }),
            Some(_) => Err(format!(
                "pattern {p:?} has a `*` before its end; only one trailing `*` is allowed"
            )),
        }
    }

    /// Whether this pattern matches `name`.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            Pattern::Exact(n) => n == name,
            Pattern::Prefix(p) => name.starts_with(p.as_str()),
            Pattern::All => true,
        }
    }

    /// Whether this pattern may name a session (`session/ID`): `*`, or a
    /// pattern written with the `session/` prefix. A channel pattern such
    /// as `s*` never reaches a session, although `session/…` starts with `s`.
    pub fn names_sessions(&self) -> bool {
        match self {
            Pattern::All => true,
            Pattern::Exact(p) | Pattern::Prefix(p) => p.starts_with(SESSION_PREFIX),
        }
    }

    /// Whether this pattern matches every name that starts with `prefix`.
    pub fn covers_prefix(&self, prefix: &str) -> bool {
        match self {
            Pattern::Exact(_) => false,
            Pattern::Prefix(p) => prefix.starts_with(p.as_str()),
            Pattern::All => true,
        }
    }
}

/// A list of patterns; it allows a name when any pattern matches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Patterns(pub Vec<Pattern>);

impl Patterns {
    /// Whether any pattern matches `name`.
    pub fn allows(&self, name: &str) -> bool {
        self.0.iter().any(|p| p.matches(name))
    }
}

/// An operation a token may be allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Follow (SSE, WebSocket), read history, read a channel's bounds;
    /// attach to a session, read its state or history.
    Subscribe,
    /// Publish (one, batch, ephemeral); create, append to, complete or
    /// cancel a session.
    Publish,
}

impl Action {
    fn as_str(self) -> &'static str {
        match self {
            Action::Subscribe => "subscribe",
            Action::Publish => "publish",
        }
    }
}

/// The channels anyone may follow and read on a server with keys: those
/// of the namespaces with `public = true` (see the module doc). Empty by
/// default.
#[derive(Clone, Default)]
pub struct PublicReads(Option<Arc<Namespaces>>);

impl PublicReads {
    /// Whether `channel`'s namespace is public.
    pub fn allows(&self, channel: &str) -> bool {
        self.0.as_ref().is_some_and(|n| n.policy(channel).public)
    }
}

impl std::fmt::Debug for PublicReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let public: Vec<&str> = self
            .0
            .iter()
            .flat_map(|n| n.named().filter(|(_, p)| p.public).map(|(name, _)| name))
            .collect();
        f.debug_tuple("PublicReads").field(&public).finish()
    }
}

impl PartialEq for PublicReads {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
            _ => false,
        }
    }
}

impl Eq for PublicReads {}

/// What one request may do: everything on an open server, else what its token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The token's `sub`, if any (the key of the publish rate limit).
    pub subject: Option<String>,
    /// Patterns of what it may follow and read.
    pub subscribe: Patterns,
    /// Patterns of what it may publish to.
    pub publish: Patterns,
    /// Unix milliseconds after which the token is no longer honoured (`exp`
    /// plus the leeway); `None` on an open server. Streams end then.
    pub expires_ms: Option<u64>,
    /// The channels it may follow and read whatever its patterns say: the
    /// public namespaces'.
    pub public: PublicReads,
    /// Whether the request presented no token (a server with keys and a
    /// public namespace): what it may not do is refused with 401, a token
    /// being what it lacks, rather than 403.
    pub anonymous: bool,
}

impl Grant {
    /// Everything, forever (an open server).
    pub fn all() -> Self {
        Grant {
            subject: None,
            subscribe: Patterns(vec![Pattern::All]),
            publish: Patterns(vec![Pattern::All]),
            expires_ms: None,
            public: PublicReads::default(),
            anonymous: false,
        }
    }

    /// The refusal of a request without a token: 401, as on a server
    /// without public namespaces.
    fn needs_token(&self, what: &str) -> ApiError {
        unauthorized(
            &format!(
                "{what} needs a token on this server: send `Authorization: Bearer <token>`, the gapless_token cookie, or ?access_token= (only the channels of public namespaces may be read without one)"
            ),
            false,
        )
    }

    fn patterns(&self, action: Action) -> &Patterns {
        match action {
            Action::Subscribe => &self.subscribe,
            Action::Publish => &self.publish,
        }
    }

    /// Whether `action` is allowed on the channel `name`: its patterns, and
    /// for `subscribe` the public namespaces.
    pub fn may(&self, action: Action, name: &str) -> bool {
        self.patterns(action).allows(name)
            || (action == Action::Subscribe && self.public.allows(name))
    }

    /// Allows `action` on channel `name`, or refuses.
    ///
    /// # Errors
    /// 403 `forbidden` naming the action and the channel (the same answer
    /// whether or not the channel exists); 401 `unauthorized` for a request
    /// without a token.
    pub fn require(&self, action: Action, name: &str) -> Result<(), ApiError> {
        if self.may(action, name) {
            Ok(())
        } else if self.anonymous {
            Err(self.needs_token(&format!("{} on channel {name:?}", action.as_str())))
        } else {
            Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "this token does not allow {} on channel {name:?}",
                    action.as_str()
                ),
            ))
        }
    }

    /// Allows `action` on session `id` (named `session/ID` in patterns), or refuses.
    ///
    /// # Errors
    /// 403 `forbidden`, the same whether or not the session exists.
    pub fn require_session(&self, action: Action, id: &str) -> Result<(), ApiError> {
        let name = format!("{SESSION_PREFIX}{id}");
        let allowed = self
            .patterns(action)
            .0
            .iter()
            .any(|p| p.names_sessions() && p.matches(&name));
        if allowed {
            Ok(())
        } else if self.anonymous {
            Err(self.needs_token(&format!("{} on session {id:?}", action.as_str())))
        } else {
            Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "this token does not allow {} on session {id:?} (pattern session/{id})",
                    action.as_str()
                ),
            ))
        }
    }

    /// Allows creating a session whose id the server draws: the token must
    /// allow `publish` on every session (`session/*` or `*`).
    ///
    /// # Errors
    /// 403 `forbidden`.
    pub fn require_any_session(&self) -> Result<(), ApiError> {
        if self
            .publish
            .0
            .iter()
            .any(|p| p.names_sessions() && p.covers_prefix(SESSION_PREFIX))
        {
            Ok(())
        } else if self.anonymous {
            Err(self.needs_token("creating a session"))
        } else {
            Err(ApiError::new(
                ErrorCode::Forbidden,
                "creating a session with a server-drawn id needs publish on session/*; \
                 or name the id in the body ({\"id\": ...}) and hold publish on session/ID",
            ))
        }
    }

    /// How long until the token stops being honoured (`None`: never).
    pub fn remaining(&self) -> Option<Duration> {
        self.expires_ms
            .map(|ms| Duration::from_millis(ms.saturating_sub(gapless_core::journal::now_ms())))
    }
}

/// Extractor: the request's [`Grant`], or a 401 answer; for a write (a
/// method other than `GET`, `HEAD`, `OPTIONS`) whose credential is the
/// [`COOKIE`] cookie, a 403 when its page is foreign
/// ([`origin::http_access`]: cross-site request forgery). Every HTTP route
/// takes its credential here, so the guard holds on each.
#[derive(Debug, Clone)]
pub(crate) struct Access(pub Arc<Grant>);

impl FromRequestParts<Arc<App>> for Access {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, ApiError> {
        origin::http_access(app, &parts.method, &parts.headers, parts.uri.query()).map(Access)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_names_prefixes_and_all() {
        let p = |s: &str| Pattern::parse(s).expect(s);
        assert!(p("rooms:*").matches("rooms:42"));
        assert!(p("rooms:*").matches("rooms:"));
        assert!(!p("rooms:*").matches("room"));
        assert!(!p("rooms:*").matches("xrooms:1"));
        assert!(p("rooms:1").matches("rooms:1"));
        assert!(!p("rooms:1").matches("rooms:10"));
        assert!(p("*").matches("anything"));
        assert!(p("*").matches("session/abc"));
        assert!(p("session/*").covers_prefix("session/"));
        assert!(
            !p("s*").names_sessions(),
            "a channel pattern never names a session"
        );
        assert!(p("session/*").names_sessions() && p("*").names_sessions());
        assert!(!p("session/a*").covers_prefix("session/"));
        assert!(!p("session/abc").covers_prefix("session/"));
        assert!(Pattern::parse("a*b").is_err());
        assert!(Pattern::parse("**").is_err());
        assert!(Pattern::parse("").is_err());
    }

    #[test]
    fn tokens_are_found_in_order_header_cookie_query() {
        let mut h = HeaderMap::new();
        h.insert(
            "cookie",
            "a=1; gapless_token=from-cookie".parse().expect("v"),
        );
        let q = Some("access_token=from-query&x=1");
        assert_eq!(
            Auth::token_of(&h, q).expect("ok").as_deref(),
            Some("from-cookie")
        );
        h.insert("authorization", "Bearer from-header".parse().expect("v"));
        assert_eq!(
            Auth::token_of(&h, q).expect("ok").as_deref(),
            Some("from-header")
        );
        assert_eq!(
            Auth::token_of(&HeaderMap::new(), q).expect("ok").as_deref(),
            Some("from-query")
        );
        assert_eq!(Auth::token_of(&HeaderMap::new(), None).expect("ok"), None);
        let mut basic = HeaderMap::new();
        basic.insert("authorization", "Basic abc".parse().expect("v"));
        assert!(Auth::token_of(&basic, q).is_err());
    }

    #[test]
    fn open_grants_everything_forever() {
        let g = Auth::open()
            .grant_of(&HeaderMap::new(), None)
            .expect("open");
        assert!(g.may(Action::Publish, "x"));
        assert!(g.require_any_session().is_ok());
        assert_eq!(g.remaining(), None);
    }
}
