//! Channel and event-type name rules.
//!
//! Channel names: 1 to [`MAX_CHANNEL_LEN`] characters of `A-Z a-z 0-9 _ - . : @ ~`,
//! but not `.` or `..`: a URL path segment of only those is removed by URL
//! normalisation (RFC 3986 §5.2.4, done by browsers, `fetch`, curl and
//! proxies), so no client could reach such a channel's URLs.
//! Event types: 1 to [`MAX_TYPE_LEN`] characters of `A-Z a-z 0-9 _ - . :`; the
//! names in [`RESERVED_TYPES`] and any type starting with [`RESERVED_TYPE_PREFIX`]
//! belong to the server's own notices, so a publisher cannot forge one.
//! Both alphabets exclude CR, LF and `:`-leading tricks that could inject an SSE field.

use thiserror::Error;

/// Longest channel name, in characters (all allowed characters are one byte).
pub const MAX_CHANNEL_LEN: usize = 200;
/// Longest event type, in characters.
pub const MAX_TYPE_LEN: usize = 64;
/// Longest session id, in characters (`A-Z a-z 0-9 _ -`).
pub const MAX_SESSION_ID_LEN: usize = 128;
/// Event types the server uses for its own notices.
pub const RESERVED_TYPES: &[&str] = &["gap"];
/// Prefix reserved for future server notices.
pub const RESERVED_TYPE_PREFIX: &str = "gapless.";

/// Why a channel name or event type was refused. The `Display` text says which rule failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is the empty string.
    #[error("{what} name is empty; it must be 1 to {max} characters")]
    Empty {
        /// "channel" or "type".
        what: &'static str,
        /// The length limit.
        max: usize,
    },
    /// The name is longer than its limit.
    #[error("{what} name is {len} characters long; at most {max} are allowed")]
    TooLong {
        /// "channel" or "type".
        what: &'static str,
        /// The offending length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The name holds a character outside its alphabet.
    #[error("{what} name contains {found:?} at position {at}; allowed characters are {allowed}")]
    BadChar {
        /// "channel" or "type".
        what: &'static str,
        /// The first character outside the alphabet.
        found: char,
        /// Its position among the name's characters, counting from 1.
        at: usize,
        /// The allowed alphabet, for the message.
        allowed: &'static str,
    },
    /// The channel name is `.` or `..`, which URL normalisation removes.
    #[error(
        "channel name {0:?} is refused: URLs drop a `.` or `..` path segment (RFC 3986 \
         section 5.2.4), so no client could reach this channel; use another name"
    )]
    DotSegment(String),
    /// The event type is reserved for the server's own notices.
    #[error("event type {0:?} is reserved for the server's own notices")]
    Reserved(String),
}

fn check(
    name: &str,
    what: &'static str,
    max: usize,
    allowed: &'static str,
    ok: fn(char) -> bool,
) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { what, max });
    }
    for (i, c) in name.chars().enumerate() {
        if !ok(c) {
            return Err(NameError::BadChar {
                what,
                found: c,
                at: i + 1,
                allowed,
            });
        }
    }
    if name.len() > max {
        return Err(NameError::TooLong {
            what,
            len: name.len(),
            max,
        });
    }
    Ok(())
}

/// Checks a channel name against the rules in this module's doc.
///
/// # Errors
/// [`NameError`] naming the rule that failed.
pub fn validate_channel(name: &str) -> Result<(), NameError> {
    check(
        name,
        "channel",
        MAX_CHANNEL_LEN,
        "A-Z a-z 0-9 _ - . : @ ~",
        |c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '@' | '~'),
    )?;
    if name == "." || name == ".." {
        return Err(NameError::DotSegment(name.to_owned()));
    }
    Ok(())
}

/// Checks a publisher-supplied event type: alphabet, length, and not reserved.
///
/// # Errors
/// [`NameError`] naming the rule that failed.
pub fn validate_type(name: &str) -> Result<(), NameError> {
    check(name, "type", MAX_TYPE_LEN, "A-Z a-z 0-9 _ - . :", |c| {
        c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')
    })?;
    if RESERVED_TYPES.contains(&name) || name.starts_with(RESERVED_TYPE_PREFIX) {
        return Err(NameError::Reserved(name.to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_alphabet_and_length() {
        assert!(validate_channel("a-Z_0.9:x@y~z").is_ok());
        assert!(matches!(validate_channel(""), Err(NameError::Empty { .. })));
        assert!(matches!(
            validate_channel(&"a".repeat(201)),
            Err(NameError::TooLong { len: 201, .. })
        ));
        assert!(validate_channel(&"a".repeat(200)).is_ok());
        let err = validate_channel("a b").unwrap_err();
        assert!(err.to_string().contains("' ' at position 2"), "{err}");
        let err = validate_channel("é").unwrap_err();
        assert!(err.to_string().contains("at position 1"), "{err}");
        assert!(validate_channel("é").is_err());
        assert!(validate_channel("a/b").is_err());
    }

    #[test]
    fn dot_segments_are_not_channels() {
        for name in [".", ".."] {
            let err = validate_channel(name).unwrap_err();
            assert!(matches!(err, NameError::DotSegment(_)), "{name}");
            assert!(err.to_string().contains("RFC 3986"), "{err}");
        }
        for name in ["...", ".a", "a..", "..b"] {
            assert!(validate_channel(name).is_ok(), "{name}");
        }
    }

    #[test]
    fn types_reserved_and_alphabet() {
        assert!(validate_type("chat.message").is_ok());
        assert!(matches!(validate_type("gap"), Err(NameError::Reserved(_))));
        assert!(matches!(
            validate_type("gapless.x"),
            Err(NameError::Reserved(_))
        ));
        assert!(validate_type("a\nb").is_err());
        assert!(validate_type("a@b").is_err());
        assert!(validate_type(&"t".repeat(65)).is_err());
    }
}
