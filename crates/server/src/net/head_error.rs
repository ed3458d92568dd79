//! What is wrong with a malformed request head, in words a client can act on.
//!
//! The HTTP/1 parser (httparse) stops at the first byte it cannot place and
//! names the part it was reading, which is not always the part at fault: in
//! `BAD METHOD / HTTP/1.1` it reads `METHOD` as the target and `/` as the
//! version, and reports "invalid HTTP version". [`describe`] reads the head
//! again against the grammar of RFC 9112 section 3 (request line: method SP
//! target SP version, single spaces) and section 5 (field lines: token `:`
//! value) and names the first part that breaks it.
//!
//! A head the parser accepts may still be refused: [`framing`] names a body
//! whose length cannot be determined (RFC 9112 section 6.3), which the HTTP
//! layer would refuse with a bare 400.
//!
//! One repair is made instead of a refusal: control bytes in a
//! `Last-Event-ID` value become `?` ([`mask_last_event_id_controls`]).
//! A browser's EventSource sends back whatever id it last read, and stops
//! for good on any answer but 200; with the `?`s (which no cursor contains,
//! and which, unlike spaces, are not trimmed off the value's ends) the value
//! is simply not a cursor, which the stream answers as documented for an
//! unreadable `Last-Event-ID`: 200 and a gap notice with reason `unknown`.

/// Says what is wrong with `head` (the bytes of a request head, whole or
/// not), which the parser refused with `e`. The words name the part (method,
/// request target, HTTP version, a header's name or value) and quote it,
/// escaped, cut to 40 characters.
pub(crate) fn describe(head: &[u8], e: httparse::Error) -> String {
    let (line, rest) = first_line(head);
    request_line(line, rest.is_some())
        .or_else(|| rest.and_then(field_lines))
        .unwrap_or_else(|| format!("{e}"))
}

/// The request line (after the empty lines a server ignores, RFC 9112
/// section 2.2) and what follows it, if its end has arrived.
fn first_line(head: &[u8]) -> (&[u8], Option<&[u8]>) {
    let start = head
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(head.len());
    let head = &head[start..];
    match head.iter().position(|&b| b == b'\n') {
        Some(i) => (strip_cr(&head[..i]), Some(&head[i + 1..])),
        None => (head, None),
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// What is wrong with the request line, if anything; `whole`: its end has
/// arrived (otherwise a word may still be cut short).
fn request_line(line: &[u8], whole: bool) -> Option<String> {
    const SHAPE: &str = "a request line is METHOD SP TARGET SP HTTP/1.1, one space apart";
    let words: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let method = words[0];
    if method.is_empty() {
        return Some(format!(
            "the request line {} starts with a space: {SHAPE}",
            quote(line)
        ));
    }
    if let Some(at) = method.iter().position(|&b| !is_tchar(b)) {
        return Some(format!(
            "the method {} is not a token: byte {} at offset {at} (RFC 9110 section 9.1: \
             letters, digits and !#$%&'*+-.^_`|~; methods are case-sensitive, e.g. GET)",
            quote(method),
            byte(method[at])
        ));
    }
    if words.len() == 1 {
        return whole.then(|| format!("the request line {} has no target: {SHAPE}", quote(line)));
    }
    if words.len() == 2 && whole {
        return Some(format!(
            "the request line {} has no HTTP version: {SHAPE}",
            quote(line)
        ));
    }
    if words[1..].iter().any(|w| w.is_empty()) && words.len() > 2 {
        return Some(format!(
            "the request line {} has two spaces in a row: {SHAPE}",
            quote(line)
        ));
    }
    let target = words[1];
    if let Some(at) = target.iter().position(|&b| b < 0x21 || b == 0x7f) {
        return Some(format!(
            "the request target {} has byte {} at offset {at}: control bytes must be \
             percent-encoded (RFC 3986)",
            quote(target),
            byte(target[at])
        ));
    }
    if words.len() > 3 {
        return Some(format!(
            "the request line {} has {} words: {SHAPE} (a space in the target is sent as %20)",
            quote(line),
            words.len()
        ));
    }
    let version = words.get(2)?;
    let served = |v: &[u8]| {
        if whole {
            *version == v
        } else {
            v.starts_with(version)
        }
    };
    if !served(b"HTTP/1.1") && !served(b"HTTP/1.0") {
        let how = if version.eq_ignore_ascii_case(b"HTTP/1.1")
            || version.eq_ignore_ascii_case(b"HTTP/1.0")
        {
            "the version is case-sensitive: HTTP/1.1"
        } else {
            "this server speaks HTTP/1.1 and HTTP/1.0 (HTTP/2 through a proxy in front of it)"
        };
        return Some(format!(
            "the HTTP version {} is not served: {how}",
            quote(version)
        ));
    }
    None
}

/// What is wrong with the first bad field line of `rest` (the head after the
/// request line), if anything.
fn field_lines(rest: &[u8]) -> Option<String> {
    for (n, line) in rest.split(|&b| b == b'\n').enumerate() {
        let line = strip_cr(line);
        if line.is_empty() {
            // The end of the head.
            return None;
        }
        let n = n + 1;
        if let Some(at) = line.iter().position(|&b| b == b'\r') {
            return Some(format!(
                "header line {n} has a CR at offset {at} not followed by LF"
            ));
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Some(format!(
                "header line {n} {} has no colon: a header name is a token followed by `:` \
                 (RFC 9110 section 5.1)",
                quote(line)
            ));
        };
        let name = &line[..colon];
        if name.is_empty() || name.iter().any(|&b| !is_tchar(b)) {
            return Some(format!(
                "header line {n}: the header name {} is not a token (RFC 9110 section 5.1: \
                 letters, digits and !#$%&'*+-.^_`|~, and no space before the colon)",
                quote(name)
            ));
        }
        let value = &line[colon + 1..];
        if let Some(at) = value
            .iter()
            .position(|&b| (b < 0x20 && b != b'\t') || b == 0x7f)
        {
            return Some(format!(
                "the header value of {} has byte {} at offset {at}: a header value is visible \
                 characters, spaces and tabs (RFC 9110 section 5.5)",
                String::from_utf8_lossy(name),
                byte(value[at])
            ));
        }
    }
    None
}

/// What makes the body's length of a whole, well-formed request head
/// impossible to determine, if anything (RFC 9112 section 6.3; section 6.1
/// for HTTP/1.0), or a request target that is not a URI (RFC 9112 section
/// 3.2). `version` is httparse's minor version (0 or 1).
///
/// These are exactly the heads the HTTP layer (hyper) refuses once the
/// parser has accepted them, read by the same rules, so a first head gets a
/// JSON answer where a later one on a keep-alive connection gets hyper's
/// bare 400:
/// - a `Transfer-Encoding` in an HTTP/1.0 request (section 6.1);
/// - a `Transfer-Encoding` whose last line does not end with `chunked`
///   (section 6.3 rule 4: a request's body length is otherwise unknowable);
/// - before any `Transfer-Encoding` line (which overrides them, rule 3), a
///   `Content-Length` that is not digits (`-1`, `+2`, `2, 2`), over the
///   largest length hyper takes, or repeated with a different value (rule 5;
///   RFC 9110 section 8.6). Repeats of one value are accepted.
pub(crate) fn framing(
    target: &str,
    version: u8,
    headers: &[httparse::Header<'_>],
) -> Option<String> {
    if let Err(e) = axum::http::Uri::try_from(target) {
        return Some(format!(
            "the request target {} is not a URI this server reads ({e}): a target is a path \
             such as /v1/sse?channel=a (RFC 9112 section 3.2)",
            quote(target.as_bytes())
        ));
    }
    let mut length: Option<(u64, &[u8])> = None;
    // The last Transfer-Encoding line: it alone says whether the body is chunked.
    let mut coding: Option<&[u8]> = None;
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if version == 0 {
                return Some(format!(
                    "Transfer-Encoding {} in an HTTP/1.0 request: HTTP/1.0 has no transfer \
                     codings, so the body's length cannot be trusted (RFC 9112 section 6.1); \
                     send HTTP/1.1, or a Content-Length",
                    quote(h.value)
                ));
            }
            coding = Some(h.value);
        } else if h.name.eq_ignore_ascii_case("content-length") && coding.is_none() {
            let Some(n) = content_length(h.value) else {
                return Some(format!(
                    "the Content-Length {} is not a number of bytes (one value, digits only: \
                     RFC 9110 section 8.6), so the body's length cannot be determined \
                     (RFC 9112 section 6.3)",
                    quote(h.value)
                ));
            };
            match length {
                Some((first, said)) if first != n => {
                    return Some(format!(
                        "Content-Length is given twice with different values, {} and {}: the \
                         body's length cannot be determined (RFC 9112 section 6.3)",
                        quote(said),
                        quote(h.value)
                    ));
                }
                Some(_) => {}
                None => length = Some((n, h.value)),
            }
        }
    }
    match coding {
        Some(v) if !ends_chunked(v) => Some(format!(
            "the Transfer-Encoding {} does not end with chunked: a request's body length is \
             known only when chunked is its last transfer coding (RFC 9112 section 6.3); \
             send Content-Length instead",
            quote(v)
        )),
        _ => None,
    }
}

/// The largest `Content-Length` the HTTP layer takes (hyper's limit).
const MAX_CONTENT_LENGTH: u64 = u64::MAX - 2;

/// A `Content-Length` value: digits only, no sign, no list (RFC 9110 section 8.6).
fn content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    let mut n = 0u64;
    for &b in value {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    (n <= MAX_CONTENT_LENGTH).then_some(n)
}

/// Whether a `Transfer-Encoding` value's last coding is `chunked` (visible
/// ASCII only, as the HTTP layer reads it).
fn ends_chunked(value: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(value) else {
        return false;
    };
    if value
        .iter()
        .any(|&b| b != b'\t' && !(0x20..0x7f).contains(&b))
    {
        return false;
    }
    text.rsplit(',')
        .next()
        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
}

/// `head` with each control byte (other than tab) in the value of a
/// `Last-Event-ID` field line replaced by `?`; `None` if no such byte is
/// there (nothing to repair). Only the head's field lines are read (up to
/// the empty line).
pub(crate) fn mask_last_event_id_controls(head: &[u8]) -> Option<Vec<u8>> {
    const NAME: &[u8] = b"last-event-id:";
    let mut out = head.to_vec();
    let mut changed = false;
    let mut start = 0;
    let mut first = true;
    while start < out.len() {
        let end = out[start..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(out.len(), |i| start + i);
        // The line without its CR LF: a lone CR inside the value is a control byte too.
        let body_end = if end > start && out[end - 1] == b'\r' && end < out.len() {
            end - 1
        } else {
            end
        };
        let line = &out[start..body_end];
        if !first && line.is_empty() {
            break;
        }
        if !first && line.len() >= NAME.len() && line[..NAME.len()].eq_ignore_ascii_case(NAME) {
            for b in &mut out[start + NAME.len()..body_end] {
                if (*b < 0x20 && *b != b'\t') || *b == 0x7f {
                    *b = b'?';
                    changed = true;
                }
            }
        }
        first = false;
        start = end + 1;
    }
    changed.then_some(out)
}

/// RFC 9110 section 5.6.2 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// `0x7f` for a byte, or `' '` for a printable one.
fn byte(b: u8) -> String {
    if b.is_ascii_graphic() || b == b' ' {
        format!("'{}'", b as char)
    } else {
        format!("0x{b:02x}")
    }
}

/// `bytes` quoted and escaped, at most 40 characters of it.
fn quote(bytes: &[u8]) -> String {
    let text: String = bytes
        .iter()
        .take(40)
        .flat_map(|&b| std::ascii::escape_default(b))
        .map(char::from)
        .collect();
    let more = if bytes.len() > 40 { "…" } else { "" };
    format!("\"{text}{more}\"")
}

#[cfg(test)]
mod tests {
    use super::describe;

    fn says(head: &[u8]) -> String {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let e = httparse::Request::new(&mut headers)
            .parse(head)
            .expect_err("malformed");
        describe(head, e)
    }

    #[test]
    fn each_part_is_named() {
        for (head, want) in [
            (&b"BAD METHOD / HTTP/1.1\r\n\r\n"[..], "4 words"),
            (b"GET /a b HTTP/1.1\r\n\r\n", "4 words"),
            (
                b"G(T / HTTP/1.1\r\n\r\n",
                "the method \"G(T\" is not a token",
            ),
            (b"G\xc3\xa9T / HTTP/1.1\r\n\r\n", "the method"),
            (b"GET  / HTTP/1.1\r\n\r\n", "two spaces"),
            (b" / HTTP/1.1\r\n\r\n", "starts with a space"),
            (b"GET /he\x7flthz HTTP/1.1\r\n\r\n", "request target"),
            (b"GET / HTTP/9.9\r\n\r\n", "HTTP version \"HTTP/9.9\""),
            (
                b"GET / http/1.1\r\n\r\n",
                "HTTP version \"http/1.1\" is not served: the version is case-sensitive",
            ),
            (
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                "\"HTTP/2.0\" is not served: this server speaks HTTP/1.1",
            ),
            (b"GET / HTTP/1.\r\n\r\n", "HTTP version \"HTTP/1.\""),
            (b"GET /\r\n\r\n", "no HTTP version"),
            (b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", "header line 1"),
            (
                b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n",
                "header name",
            ),
            (
                b"GET / HTTP/1.1\r\nx: a\x01b\r\n\r\n",
                "header value of x has byte 0x01",
            ),
        ] {
            let got = says(head);
            assert!(got.contains(want), "{head:?}: {got}");
        }
    }

    #[test]
    fn control_bytes_in_last_event_id_become_question_marks_and_nothing_else_changes() {
        let head = b"GET /v1/sse HTTP/1.1\r\nX-A: 1\r\nlast-Event-ID: a\x01b\rc\x7f\r\n\r\nx: \x01";
        let fixed = super::mask_last_event_id_controls(head).expect("repaired");
        assert_eq!(
            fixed,
            b"GET /v1/sse HTTP/1.1\r\nX-A: 1\r\nlast-Event-ID: a?b?c?\r\n\r\nx: \x01"
        );
        assert_eq!(
            super::mask_last_event_id_controls(b"GET / HTTP/1.1\r\nX: \x01\r\n\r\n"),
            None
        );
        assert_eq!(
            super::mask_last_event_id_controls(b"GET / HTTP/1.1\r\nLast-Event-ID: ok\r\n\r\n"),
            None
        );
    }

    fn framing_of(head: &[u8]) -> Option<String> {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut req = httparse::Request::new(&mut headers);
        assert!(req.parse(head).expect("well formed").is_complete());
        super::framing(
            req.path.expect("target"),
            req.version.expect("version"),
            req.headers,
        )
    }

    #[test]
    fn a_body_length_that_cannot_be_determined_is_named() {
        for (head, want) in [
            (
                &b"POST / HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 3\r\n\r\n"[..],
                "Content-Length is given twice with different values, \"2\" and \"3\"",
            ),
            (
                b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
                "the Content-Length \"-1\" is not a number of bytes",
            ),
            (b"POST / HTTP/1.1\r\nContent-Length: +2\r\n\r\n", "\"+2\""),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 2, 2\r\n\r\n",
                "\"2, 2\"",
            ),
            (
                b"POST / HTTP/1.1\r\nContent-Length: \r\n\r\n",
                "Content-Length \"\"",
            ),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 18446744073709551614\r\n\r\n",
                "not a number of bytes",
            ),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
                "the Transfer-Encoding \"gzip\" does not end with chunked",
            ),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n",
                "\"gzip\" does not end with chunked",
            ),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                "does not end with chunked",
            ),
            (
                b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                "in an HTTP/1.0 request",
            ),
            (
                b"GET http:// HTTP/1.1\r\n\r\n",
                "the request target \"http://\" is not a URI",
            ),
        ] {
            let got = framing_of(head).unwrap_or_default();
            assert!(got.contains(want), "{head:?}: {got:?}");
            assert!(
                got.contains("RFC 9112") || got.contains("RFC 9110"),
                "{got}"
            );
        }
        for head in [
            &b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nContent-Length: 18446744073709551613\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, CHUNKED \r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
            // Transfer-Encoding overrides a Content-Length after it (RFC 9112 section 6.3 rule 3).
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: -1\r\n\r\n",
            b"POST / HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
            b"GET /v1/sse?channel=a&channel=b HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(framing_of(head), None, "{head:?}");
        }
    }

    #[test]
    fn a_partial_head_is_judged_on_what_arrived() {
        assert!(says(b"G(T").contains("method"));
        assert!(says(b"GET / HTTP/2").contains("HTTP version"));
    }
}
