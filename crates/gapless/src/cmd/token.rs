//! `gapless token`: makes a signed token (JWT) in the shape a server started
//! with `--jwt-secret` or `--jwt-public-key` verifies (`docs/security.md`),
//! and prints it on one line.

use super::fail;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use std::path::PathBuf;
use std::process::ExitCode;

/// `gapless token` flags.
#[derive(Debug, clap::Args)]
pub(crate) struct TokenArgs {
    /// A channel pattern the token may follow and read (repeatable): a name,
    /// a prefix ending in `*`, `*` for every channel, or `session/ID`.
    #[arg(long, value_name = "PATTERN")]
    pub subscribe: Vec<String>,
    /// A channel pattern the token may publish to (repeatable); `session/*`
    /// lets it create and feed sessions.
    #[arg(long, value_name = "PATTERN")]
    pub publish: Vec<String>,
    /// Seconds until the token expires (its `exp`).
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    pub ttl: u64,
    /// The token's subject (`sub`): who it is for; the publish rate limit is kept per subject.
    #[arg(long)]
    pub sub: Option<String>,
    /// The token's audience (`aud`), for a server started with --jwt-audience.
    #[arg(long)]
    pub aud: Option<String>,
    /// The token's issuer (`iss`), for a server started with --jwt-issuer.
    #[arg(long)]
    pub iss: Option<String>,
    /// HS256 secret to sign with (the server's --jwt-secret).
    #[arg(long, env = "GAPLESS_JWT_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
    /// File holding the HS256 secret (trailing newlines are ignored).
    #[arg(long, conflicts_with = "secret")]
    pub secret_file: Option<PathBuf>,
    /// PEM private key to sign with: RSA (RS256) or EC P-256 (ES256); the
    /// server holds the matching public key (--jwt-public-key).
    #[arg(long, conflicts_with_all = ["secret", "secret_file"])]
    pub private_key: Option<PathBuf>,
}

/// Runs `gapless token`.
pub(crate) fn run(args: TokenArgs) -> ExitCode {
    match make(&args) {
        Ok(token) => {
            println!("{token}");
            ExitCode::SUCCESS
        }
        Err(line) => fail(&line),
    }
}

fn make(args: &TokenArgs) -> Result<String, String> {
    let (alg, key) = match (&args.secret, &args.secret_file, &args.private_key) {
        (Some(s), _, _) => (Algorithm::HS256, hmac(s.as_bytes())?),
        (None, Some(path), _) => {
            let mut bytes = std::fs::read(path)
                .map_err(|e| format!("cannot read --secret-file {}: {e}", path.display()))?;
            while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                bytes.pop();
            }
            (Algorithm::HS256, hmac(&bytes)?)
        }
        (None, None, Some(path)) => {
            let pem = std::fs::read(path)
                .map_err(|e| format!("cannot read --private-key {}: {e}", path.display()))?;
            match EncodingKey::from_rsa_pem(&pem) {
                Ok(k) => (Algorithm::RS256, k),
                Err(_) => match EncodingKey::from_ec_pem(&pem) {
                    Ok(k) => (Algorithm::ES256, k),
                    Err(e) => {
                        return Err(format!(
                            "{} is not a PEM private key of RSA or EC P-256 type (PKCS#8): {e}",
                            path.display()
                        ))
                    }
                },
            }
        }
        (None, None, None) => {
            return Err(
                "give the key to sign with: --secret (or GAPLESS_JWT_SECRET), --secret-file, or --private-key"
                    .to_owned(),
            )
        }
    };
    for p in args.subscribe.iter().chain(&args.publish) {
        gapless_server::auth::Pattern::parse(p)
            .map_err(|e| format!("--subscribe/--publish: {e}"))?;
    }
    if args.subscribe.is_empty() && args.publish.is_empty() {
        return Err(
            "the token would allow nothing: give --subscribe PATTERN and/or --publish PATTERN"
                .to_owned(),
        );
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let exp = expiry(now, args.ttl)?;
    let mut claims = serde_json::json!({
        "iat": now,
        "exp": exp,
        "gapless": {"subscribe": args.subscribe, "publish": args.publish},
    });
    for (name, value) in [("sub", &args.sub), ("aud", &args.aud), ("iss", &args.iss)] {
        if let Some(v) = value {
            claims[name] = serde_json::Value::from(v.as_str());
        }
    }
    jsonwebtoken::encode(&Header::new(alg), &claims, &key)
        .map_err(|e| format!("cannot sign the token: {e}"))
}

/// The latest `exp` a token is given: 2^53 - 1 seconds since 1970, the
/// largest whole number a JSON number holds exactly in the double that
/// servers (gapless among them) and JavaScript read it into.
const EXP_MAX: u64 = (1 << 53) - 1;

/// `now + ttl` seconds, or a message when that passes [`EXP_MAX`] (a sum
/// that wrapped around would make a token that is already expired).
fn expiry(now: u64, ttl: u64) -> Result<u64, String> {
    match now.checked_add(ttl) {
        Some(exp) if exp <= EXP_MAX => Ok(exp),
        _ => Err(format!(
            "--ttl {ttl} is too long: the token's expiry would pass the latest time a token can \
             hold ({EXP_MAX} seconds since 1970); give at most {} seconds",
            EXP_MAX.saturating_sub(now)
        )),
    }
}

fn hmac(secret: &[u8]) -> Result<EncodingKey, String> {
    if secret.len() < gapless_server::auth::MIN_SECRET_BYTES {
        return Err(format!(
            "the secret is {} bytes; HS256 needs at least {} (the server refuses shorter ones)",
            secret.len(),
            gapless_server::auth::MIN_SECRET_BYTES
        ));
    }
    EncodingKey::from_secret(secret).map_err(|e| format!("cannot use the secret: {e}"))
}
