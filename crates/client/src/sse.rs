//! A standalone, incremental Server-Sent Events parser.
//!
//! It implements the event-stream interpretation of the WHATWG HTML standard
//! ("Server-sent events", *Interpreting an event stream*) exactly, over bytes
//! that arrive in chunks of any size:
//!
//! - lines end with LF, CR or CRLF, including a CRLF whose CR ends one chunk
//!   and whose LF starts the next;
//! - one leading U+FEFF BOM is stripped (even when split across chunks), a
//!   second one is content;
//! - a line starting with `:` is a comment and is ignored (no dispatch);
//! - a line without `:` is a field name with an empty value; after the colon
//!   one optional space is removed;
//! - `data` values are joined with LF (the final LF is removed at dispatch);
//! - `id` sets the last event ID buffer unless its value contains NUL;
//! - `retry` is applied only when its value is ASCII digits;
//! - a blank line dispatches: the last event ID *string* becomes the buffer's
//!   value, and an event fires only if the data buffer is not empty;
//! - an event not terminated by a blank line when the stream ends is never
//!   dispatched, and its `id` never becomes the last event ID
//!   ([`Parser::finish`]);
//! - bytes are decoded as UTF-8 with U+FFFD for invalid sequences, and a code
//!   point split across chunks decodes correctly (lines are decoded whole).
//!
//! Beyond the standard, one event block may hold at most
//! [`Parser::max_event_bytes`] bytes (every line of the block, line ends
//! excluded, including a line still being received), so a broken or hostile
//! stream cannot grow memory without bound: past it [`Parser::feed`] fails
//! with [`EventTooLarge`].
//!
//! The parser does no I/O and allocates only its reusable buffers: a complete
//! line inside a chunk is parsed in place, only a line cut by a chunk boundary
//! is copied, and dispatched events are lent to a callback as [`Item`]s that
//! borrow those buffers. A load generator can therefore keep one [`Parser`]
//! per stream and count events without allocating per event.
//!
//! ```
//! use gapless_client::sse::{Item, Parser};
//!
//! let mut parser = Parser::new();
//! let mut seen = Vec::new();
//! for chunk in [&b"retry: 500\n\nid: c1\ndata: hel"[..], b"lo\ndata: world\r", b"\n\n: ping\n\n"] {
//!     parser
//!         .feed(chunk, |item| {
//!             if let Item::Event(e) = item {
//!                 seen.push((e.last_event_id.to_owned(), e.data.to_owned()));
//!             }
//!         })
//!         .expect("events are small");
//! }
//! assert_eq!(seen, [("c1".to_owned(), "hello\nworld".to_owned())]);
//! assert_eq!(parser.retry(), Some(500));
//! assert_eq!(parser.last_event_id(), "c1");
//! ```

use std::fmt;

/// Default [`Parser::max_event_bytes`]: 16 MiB, well above the server's
/// default `--max-event-bytes` (1 MiB) even after JSON envelope escaping.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// A dispatched event, borrowing the parser's buffers until the callback returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRef<'a> {
    /// The event type: the last `event` field's value, or `"message"` when the
    /// block had none (or an empty one), as the standard specifies.
    pub event_type: &'a str,
    /// The `data` lines joined with LF.
    pub data: &'a str,
    /// The last event ID string after this dispatch: set by this block's `id`
    /// field, or carried over from an earlier block of the same stream.
    pub last_event_id: &'a str,
}

impl EventRef<'_> {
    /// Copies the event out of the parser's buffers.
    pub fn to_owned_event(&self) -> Event {
        Event {
            event_type: self.event_type.to_owned(),
            data: self.data.to_owned(),
            last_event_id: self.last_event_id.to_owned(),
        }
    }
}

/// An owned copy of an [`EventRef`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Event {
    /// See [`EventRef::event_type`].
    pub event_type: String,
    /// See [`EventRef::data`].
    pub data: String,
    /// See [`EventRef::last_event_id`].
    pub last_event_id: String,
}

/// What a chunk of the stream produced, in stream order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item<'a> {
    /// An event fired (a blank line ended a block whose data buffer was not empty).
    Event(EventRef<'a>),
    /// A blank line ended a block with no data (so no event fired) and the last
    /// event ID string changed to this value. gapless sends such an `id:`-only
    /// frame to tell a client where it stands without firing an event.
    LastEventId(&'a str),
    /// A `retry` field set the reconnection time, in milliseconds.
    Retry(u64),
}

/// An owned copy of an [`Item`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedItem {
    /// See [`Item::Event`].
    Event(Event),
    /// See [`Item::LastEventId`].
    LastEventId(String),
    /// See [`Item::Retry`].
    Retry(u64),
}

impl Item<'_> {
    /// Copies the item out of the parser's buffers.
    pub fn to_owned_item(&self) -> OwnedItem {
        match *self {
            Item::Event(e) => OwnedItem::Event(e.to_owned_event()),
            Item::LastEventId(id) => OwnedItem::LastEventId(id.to_owned()),
            Item::Retry(ms) => OwnedItem::Retry(ms),
        }
    }
}

/// An event block grew past [`Parser::max_event_bytes`]. The parser stays
/// failed: every later [`Parser::feed`] returns this error until [`Parser::reset`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTooLarge {
    /// The limit that was exceeded, in bytes.
    pub limit: usize,
}

impl fmt::Display for EventTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "an SSE event is larger than the client's limit of {} bytes",
            self.limit
        )
    }
}

impl std::error::Error for EventTooLarge {}

/// An incremental SSE parser for one stream; see the module doc.
#[derive(Debug, Clone)]
pub struct Parser {
    max_event_bytes: usize,
    /// The start of a line cut by a chunk boundary.
    line: Vec<u8>,
    /// Bytes of the completed lines of the current block.
    block_bytes: usize,
    data: String,
    event_type: String,
    id_buffer: String,
    last_event_id: String,
    retry: Option<u64>,
    /// The previous chunk ended with CR: an LF starting the next one belongs to it.
    after_cr: bool,
    /// How many bytes of the BOM matched so far; 3 once the start is past.
    bom: usize,
    failed: bool,
}

impl Default for Parser {
    fn default() -> Self {
        Self::new()
    }
}

impl Parser {
    /// A parser with the [`DEFAULT_MAX_EVENT_BYTES`] limit.
    pub fn new() -> Self {
        Self::with_max_event_bytes(DEFAULT_MAX_EVENT_BYTES)
    }

    /// A parser whose event blocks may hold at most `max` bytes.
    pub fn with_max_event_bytes(max: usize) -> Self {
        Parser {
            max_event_bytes: max,
            line: Vec::new(),
            block_bytes: 0,
            data: String::new(),
            event_type: String::new(),
            id_buffer: String::new(),
            last_event_id: String::new(),
            retry: None,
            after_cr: false,
            bom: 0,
            failed: false,
        }
    }

    /// The event size limit, in bytes.
    pub fn max_event_bytes(&self) -> usize {
        self.max_event_bytes
    }

    /// The last event ID string: the `id` of the last dispatched block that
    /// set one (empty before any).
    pub fn last_event_id(&self) -> &str {
        &self.last_event_id
    }

    /// The reconnection time from the last valid `retry` field, in milliseconds.
    pub fn retry(&self) -> Option<u64> {
        self.retry
    }

    /// Parses the next chunk of the stream, calling `on_item` for every item it
    /// completes, in order. Chunks may split the stream anywhere.
    ///
    /// # Errors
    /// [`EventTooLarge`] when an event block exceeds the limit; items completed
    /// before the offending block have been passed to `on_item`.
    pub fn feed<F>(&mut self, chunk: &[u8], mut on_item: F) -> Result<(), EventTooLarge>
    where
        F: FnMut(Item<'_>),
    {
        if self.failed {
            return Err(self.too_large());
        }
        let mut rest = chunk;
        while self.bom < BOM.len() {
            let Some((&b, tail)) = rest.split_first() else {
                return Ok(());
            };
            if b == BOM[self.bom] {
                self.bom += 1;
                rest = tail;
            } else {
                // Not a BOM: what matched so far is the start of the first line.
                self.line.extend_from_slice(&BOM[..self.bom]);
                self.bom = BOM.len();
            }
        }
        if self.after_cr {
            match rest.first() {
                None => return Ok(()),
                Some(b'\n') => rest = &rest[1..],
                Some(_) => {}
            }
            self.after_cr = false;
        }
        while let Some(i) = memchr::memchr2(b'\n', b'\r', rest) {
            let ended_with_cr = rest[i] == b'\r';
            let (head, tail) = (&rest[..i], &rest[i + 1..]);
            if self.line.is_empty() {
                self.end_line(head, &mut on_item)?;
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(head);
                let result = self.end_line(&line, &mut on_item);
                line.clear();
                self.line = line;
                result?;
            }
            rest = tail;
            if ended_with_cr {
                match rest.first() {
                    None => {
                        self.after_cr = true;
                        return Ok(());
                    }
                    Some(b'\n') => rest = &rest[1..],
                    Some(_) => {}
                }
            }
        }
        if !rest.is_empty() {
            if self.block_bytes + self.line.len() + rest.len() > self.max_event_bytes {
                return Err(self.fail());
            }
            self.line.extend_from_slice(rest);
        }
        Ok(())
    }

    /// The stream ended: an event block not terminated by a blank line is
    /// discarded, so it never fires and its `id` never becomes the last event
    /// ID. The last event ID string and the retry time are kept.
    pub fn finish(&mut self) {
        self.line.clear();
        self.block_bytes = 0;
        self.data.clear();
        self.event_type.clear();
        self.id_buffer.clone_from(&self.last_event_id);
        self.after_cr = false;
    }

    /// Prepares for a new stream (a reconnection): discards any pending block,
    /// clears the failed state and expects an optional BOM again. As the
    /// standard specifies, the new stream's last event ID buffer starts empty;
    /// [`Parser::last_event_id`] and [`Parser::retry`] keep their values until
    /// the next dispatch or `retry` field.
    pub fn reset(&mut self) {
        self.finish();
        self.id_buffer.clear();
        self.bom = 0;
        self.failed = false;
    }

    fn too_large(&self) -> EventTooLarge {
        EventTooLarge {
            limit: self.max_event_bytes,
        }
    }

    fn fail(&mut self) -> EventTooLarge {
        self.failed = true;
        self.finish();
        self.too_large()
    }

    /// Handles one complete line (without its line end).
    fn end_line<F>(&mut self, line: &[u8], on_item: &mut F) -> Result<(), EventTooLarge>
    where
        F: FnMut(Item<'_>),
    {
        if line.is_empty() {
            self.dispatch(on_item);
            return Ok(());
        }
        self.block_bytes += line.len();
        if self.block_bytes > self.max_event_bytes {
            return Err(self.fail());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (name, value) = match memchr::memchr(b':', line) {
            Some(c) => {
                let v = &line[c + 1..];
                (&line[..c], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match name {
            b"event" => {
                self.event_type.clear();
                push_utf8(&mut self.event_type, value);
            }
            b"data" => {
                push_utf8(&mut self.data, value);
                self.data.push('\n');
            }
            b"id" if !value.contains(&0) => {
                self.id_buffer.clear();
                push_utf8(&mut self.id_buffer, value);
            }
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                let ms = value.iter().fold(0u64, |acc, d| {
                    acc.saturating_mul(10).saturating_add(u64::from(d - b'0'))
                });
                self.retry = Some(ms);
                on_item(Item::Retry(ms));
            }
            _ => {}
        }
        Ok(())
    }

    /// A blank line: "dispatch the event" as the standard defines it.
    fn dispatch<F>(&mut self, on_item: &mut F)
    where
        F: FnMut(Item<'_>),
    {
        self.block_bytes = 0;
        let id_changed = self.last_event_id != self.id_buffer;
        if id_changed {
            self.last_event_id.clone_from(&self.id_buffer);
        }
        if self.data.is_empty() {
            self.event_type.clear();
            if id_changed {
                on_item(Item::LastEventId(&self.last_event_id));
            }
            return;
        }
        if self.data.ends_with('\n') {
            self.data.pop();
        }
        let event_type = if self.event_type.is_empty() {
            "message"
        } else {
            &self.event_type
        };
        on_item(Item::Event(EventRef {
            event_type,
            data: &self.data,
            last_event_id: &self.last_event_id,
        }));
        self.data.clear();
        self.event_type.clear();
    }
}

/// Appends `bytes` decoded as UTF-8, with U+FFFD for invalid sequences.
fn push_utf8(out: &mut String, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(s) => out.push_str(s),
        Err(_) => out.push_str(&String::from_utf8_lossy(bytes)),
    }
}

/// Parses a whole stream (as one chunk) and returns its items, owned. A
/// convenience for tests and tools; streaming code should use [`Parser::feed`].
///
/// # Errors
/// [`EventTooLarge`] as for [`Parser::feed`].
pub fn parse_all(stream: &[u8], max_event_bytes: usize) -> Result<Vec<OwnedItem>, EventTooLarge> {
    let mut parser = Parser::with_max_event_bytes(max_event_bytes);
    let mut out = Vec::new();
    parser.feed(stream, |item| out.push(item.to_owned_item()))?;
    parser.finish();
    Ok(out)
}
