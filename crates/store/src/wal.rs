//! The write-ahead log: how a commit becomes durable without a redb
//! transaction.
//!
//! A group commit's records (`log.rs`: appends and channel metadata
//! changes) are written as one *frame* to
//! a WAL file with one `pwrite`, and made durable with one `fdatasync`
//! (`sync.rs`); the records reach the indexed tables of `journal.redb`
//! later, in a checkpoint of their own (`checkpoint.rs`), which also records
//! the last frame it applied (`meta["wal_applied"]`) in the same
//! transaction. Opening the store applies every frame after that one.
//!
//! Two files, [`FILE_NAMES`], used in turn. Each is emptied and zero-filled
//! to [`FILE_BYTES`] when the store opens (after applying what they held),
//! so a frame overwrites allocated blocks and its `fdatasync` flushes data
//! only (a frame that does not fit extends the file, which is only slower). Layout, integers little-endian:
//!
//! - header, at offset 0, [`HEADER_LEN`] bytes: `magic 8 | generation u64 |
//!   salt u64 | base lsn u64 | crc32 u32 | 0 u32`;
//! - frames from [`HEADER_LEN`] on, each `magic u32 | len u32 | lsn u64 |
//!   salt u64 | crc32 u32 | 0 u32` ([`FRAME_HEAD`] bytes) then `len` bytes of
//!   records.
//!
//! A file's *chain* is its frames from the header on while each has the
//! header's salt, the next lsn (the first: the base) and a crc32 (over lsn,
//! salt, len and the records) that verifies; the first frame that does not
//! (a torn write, zeros, an older frame left from an earlier use of the
//! file) ends it. Lsns count frames over the store's life.
//!
//! The writer moves to the other file once the current one holds
//! [`FILE_BYTES`], if every frame in the other is already applied to the
//! tables: it writes the other file's new header (a new random salt, the
//! next generation, base = the next lsn) with the first frame. A new
//! salt and header are also written when the store opens (after applying
//! everything) and after a failed write or `fdatasync` (after applying
//! everything acknowledged): frames of an earlier use of a file never join
//! a chain. Reading the log ([`read`]) takes the files in generation order;
//! a later file's chain replaces whatever an earlier one holds from its base
//! on (the frames a failure discarded).

use crate::tables::storage;
use gapless_core::JournalError;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The two WAL files, in the data directory.
pub(crate) const FILE_NAMES: [&str; 2] = ["journal.wal.0", "journal.wal.1"];
/// Bytes each WAL file is zero-filled to; the writer moves to the other file
/// once the current one holds this much (8 MiB for both, written when the
/// store opens).
pub(crate) const FILE_BYTES: u64 = 4 << 20;
/// Bytes of a file's header.
pub(crate) const HEADER_LEN: usize = 40;
/// Bytes of a frame's head.
pub(crate) const FRAME_HEAD: usize = 32;

const FILE_MAGIC: [u8; 8] = *b"GLSWAL\x00\x01";
const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"GLFR");

#[cfg(test)]
thread_local! {
    /// Test hook: the next [`Wal::open_sized`] on this thread fails once
    /// both files are emptied, before either has a header (a crash there).
    pub(crate) static FAIL_OPEN_AFTER_EMPTYING: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
}

/// A frame read back: its lsn and records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub lsn: u64,
    pub records: Vec<u8>,
}

/// A file's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    generation: u64,
    salt: u64,
    base: u64,
}

fn crc(parts: &[&[u8]]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for p in parts {
        h.update(p);
    }
    h.finalize()
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn put_header(out: &mut Vec<u8>, h: Header) {
    let start = out.len();
    out.extend_from_slice(&FILE_MAGIC);
    for v in [h.generation, h.salt, h.base] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let sum = crc(&[&out[start..]]);
    out.extend_from_slice(&sum.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
}

fn header_of(b: &[u8]) -> Option<Header> {
    if b.len() < HEADER_LEN || b[..8] != FILE_MAGIC || crc(&[&b[..32]]) != u32_at(b, 32) {
        return None;
    }
    Some(Header {
        generation: u64_at(b, 8),
        salt: u64_at(b, 16),
        base: u64_at(b, 24),
    })
}

/// Appends frame `lsn` holding `records` to `out`.
fn put_frame(out: &mut Vec<u8>, lsn: u64, salt: u64, records: &[u8]) {
    let len = u32::try_from(records.len()).unwrap_or(u32::MAX);
    let (lsn_b, salt_b, len_b) = (lsn.to_le_bytes(), salt.to_le_bytes(), len.to_le_bytes());
    out.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
    out.extend_from_slice(&len_b);
    out.extend_from_slice(&lsn_b);
    out.extend_from_slice(&salt_b);
    out.extend_from_slice(&crc(&[&lsn_b, &salt_b, &len_b, records]).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(records);
}

/// The frame at `at` in `bytes` if it is whole: magic, length within
/// `bytes`, salt `salt`, and a crc32 that verifies. Returns its lsn and
/// records, whatever its lsn.
fn frame_at(bytes: &[u8], at: usize, salt: u64) -> Option<(u64, &[u8])> {
    let head = bytes.get(at..at.checked_add(FRAME_HEAD)?)?;
    let len = u32_at(head, 4) as usize;
    if u32_at(head, 0) != FRAME_MAGIC || u64_at(head, 16) != salt {
        return None;
    }
    let records = bytes.get(at + FRAME_HEAD..(at + FRAME_HEAD).checked_add(len)?)?;
    if crc(&[&head[8..16], &head[16..24], &head[4..8], records]) != u32_at(head, 24) {
        return None;
    }
    Some((u64_at(head, 8), records))
}

/// A file's chain that ends at a bad frame although a whole frame of the
/// same chain (its salt, a later lsn) lies further on: the bad frame was
/// damaged after it was written, not torn by a crash (see [`Log::after`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Damage {
    /// The file's name ([`FILE_NAMES`]).
    pub file: &'static str,
    /// Byte offset in the file where the chain ends (the bad frame).
    pub offset: usize,
    /// The lsn the bad frame should have: the first commit the chain lacks.
    pub missing: u64,
    /// The highest lsn of a whole frame of the chain after the bad one.
    pub found: u64,
    /// The byte offset of that frame.
    pub found_at: usize,
}

/// The whole frames of the chain with `salt` after offset `from` (where its
/// chain ended, at a frame that should have had lsn `missing`) with an lsn of
/// `missing` or more: the highest such lsn and its offset. A torn tail has
/// none: under `Sync` a frame is written only once every earlier one is
/// durable, so a crash tears the last frames written and nothing after them.
fn later_frame(bytes: &[u8], from: usize, salt: u64, missing: u64) -> Option<(u64, usize)> {
    let magic = FRAME_MAGIC.to_le_bytes();
    let mut best = None;
    let mut at = from + 1;
    while at + FRAME_HEAD <= bytes.len() {
        if bytes[at..at + 4] == magic {
            if let Some((lsn, _)) = frame_at(bytes, at, salt) {
                if lsn >= missing && best.is_none_or(|(b, _)| lsn > b) {
                    best = Some((lsn, at));
                }
            }
        }
        at += 1;
    }
    best
}

/// The chain of a file's bytes: its header and frames (see the module doc),
/// and where it ended: the offset of the first byte after its last frame.
fn chain_ending(bytes: &[u8]) -> Option<(Header, Vec<Frame>, usize)> {
    let header = header_of(bytes)?;
    let mut frames = Vec::new();
    let mut at = HEADER_LEN;
    let mut lsn = header.base;
    while let Some((got, records)) = frame_at(bytes, at, header.salt) {
        if got != lsn {
            break;
        }
        frames.push(Frame {
            lsn,
            records: records.to_vec(),
        });
        at += FRAME_HEAD + records.len();
        lsn += 1;
    }
    Some((header, frames, at))
}

/// The chain of a file's bytes: its header and frames (see the module doc).
#[cfg(test)]
fn chain(bytes: &[u8]) -> Option<(Header, Vec<Frame>)> {
    chain_ending(bytes).map(|(h, f, _)| (h, f))
}

/// What the WAL files of a directory hold.
#[derive(Debug, Default)]
pub(crate) struct Log {
    /// The frames of the log, in lsn order, each lsn once (see [`read`]).
    pub frames: Vec<Frame>,
    /// The highest generation of a valid header (0: none).
    pub generation: u64,
    /// Chains that end at a damaged frame (see [`Damage`]), in generation
    /// order.
    pub damage: Vec<Damage>,
}

impl Log {
    /// The frames after `applied`: those that follow it without a break in
    /// the lsns (`applied + 1`, `applied + 2`, ...).
    ///
    /// A break (a missing lsn, then later frames) is what an `Async` run's
    /// power loss can leave: the frames of one file were made durable
    /// without the older frames of the other, as the kernel writes pages
    /// back in any order. With `lenient` (the last run had
    /// [`crate::Durability::Async`] and did not stop cleanly) the log is cut
    /// there, like a torn tail: what follows the break is lost with it, the
    /// documented "up to a second". Otherwise every frame after `applied`
    /// was durable before it was acknowledged, and a break is damage.
    ///
    /// A chain that ends at a bad frame with a whole frame of the same chain
    /// after it ([`Damage`]) is damage too when that frame is not yet in the
    /// tables (its lsn is above `applied`): under `Sync` a frame is written
    /// only once the round before it is durable, so the bad frame was
    /// durable, and acknowledged, before something overwrote it. A crash
    /// tears only the last frames written, with nothing of the chain after
    /// them: that torn tail ends the log without an error. With `lenient`
    /// the frames after the bad one may be what a power loss wrote back out
    /// of order, so the log is cut there, as at a break.
    ///
    /// # Errors
    /// [`JournalError::Storage`] when, without `lenient`, frames after
    /// `applied` exist but do not all follow it without a break, or a chain
    /// ends at a damaged frame with a frame after `applied` behind it:
    /// commits the log should hold are missing. The message names the file,
    /// the byte offsets and the lsns, and says what to do.
    pub(crate) fn after(
        &self,
        applied: u64,
        dir: &Path,
        lenient: bool,
    ) -> Result<&[Frame], JournalError> {
        if let Some(d) = self.damage.iter().find(|d| d.found > applied) {
            if !lenient {
                return Err(damaged_frame(d, applied, dir));
            }
            tracing::warn!(
                file = d.file,
                offset = d.offset,
                missing = d.missing,
                found = d.found,
                "a frame of the journal's write-ahead log does not verify but later frames do \
                 (a power loss under async durability): the log is cut there, like a torn tail"
            );
        }
        let start = self.frames.partition_point(|f| f.lsn <= applied);
        let rest = &self.frames[start..];
        let whole = rest
            .iter()
            .zip(applied + 1..)
            .take_while(|(f, lsn)| f.lsn == *lsn)
            .count();
        let Some(next) = rest.get(whole) else {
            return Ok(rest);
        };
        let missing = applied + 1 + whole as u64;
        if lenient {
            tracing::warn!(
                missing,
                found = next.lsn,
                dropped = rest.len() - whole,
                "the journal's write-ahead log has a break in its commits (a power loss under \
                 async durability): it is cut there, like a torn tail"
            );
            return Ok(&rest[..whole]);
        }
        Err(JournalError::Storage(format!(
            "the journal's write-ahead log in {} is damaged: commit {missing} is missing but \
             commits from {} on follow it, and the journal needs every commit after {applied} \
             (a WAL file was removed, overwritten or damaged?); restore the data directory from \
             a backup",
            dir.display(),
            next.lsn
        )))
    }
}

impl Log {
    /// [`Log::after`], once the log is known to be there at all: with
    /// `wal_live` (a process had it open and did not stop cleanly) files
    /// without a valid header lose every commit after the tables' last. The
    /// start (`checkpoint::recover`) and `gapless journal check` both call
    /// this, so they refuse the same logs.
    ///
    /// # Errors
    /// As [`Log::after`], and [`JournalError::Storage`] when `wal_live` and
    /// neither file has a valid header.
    pub(crate) fn pending(
        &self,
        applied: u64,
        wal_live: bool,
        dir: &Path,
        lenient: bool,
    ) -> Result<&[Frame], JournalError> {
        if self.generation == 0 && wal_live {
            return Err(JournalError::Storage(format!(
                "the journal in {} was not closed cleanly and its write-ahead log ({} and {}) is \
                 missing: the commits after its last checkpoint would be lost; restore the whole \
                 data directory from a backup (a copy of journal.redb alone is not one)",
                dir.display(),
                FILE_NAMES[0],
                FILE_NAMES[1]
            )));
        }
        self.after(applied, dir, lenient)
    }
}

/// The refusal of a log whose chain ends at damage `d` with commits after
/// `applied` behind it.
fn damaged_frame(d: &Damage, applied: u64, dir: &Path) -> JournalError {
    let path = dir.join(d.file);
    let lost = d.missing.max(applied + 1);
    JournalError::Storage(format!(
        "the journal's write-ahead log file {} is damaged at byte {}: the frame of commit {} \
         there does not verify, but a whole frame of commit {} of the same log follows at byte \
         {}, so it was overwritten after it was written (a crash tears only the last frames), \
         and the acknowledged commits {lost} to {} would be lost. With the server stopped: \
         restore the data directory from a backup; or, to accept losing the commits from {lost} \
         on, keep a copy of the file and cut it at the damage (`truncate -s {} {}`)",
        path.display(),
        d.offset,
        d.missing,
        d.found,
        d.found_at,
        d.found,
        d.offset,
        path.display()
    ))
}

/// Reads the WAL files in `dir` (missing ones are empty).
///
/// # Errors
/// [`JournalError::Storage`] when a file exists but cannot be read.
pub(crate) fn read(dir: &Path) -> Result<Log, JournalError> {
    let mut files = Vec::new();
    for name in FILE_NAMES {
        let path = dir.join(name);
        let mut bytes = Vec::new();
        match File::open(&path) {
            Ok(mut f) => {
                f.read_to_end(&mut bytes)
                    .map_err(|e| io_error("cannot read", &path, e))?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error("cannot open", &path, e)),
        }
        if let Some((header, frames, end)) = chain_ending(&bytes) {
            let missing = header.base + frames.len() as u64;
            let damage =
                later_frame(&bytes, end, header.salt, missing).map(|(found, found_at)| Damage {
                    file: name,
                    offset: end,
                    missing,
                    found,
                    found_at,
                });
            files.push((header, frames, damage));
        }
    }
    files.sort_by_key(|(h, _, _)| h.generation);
    let mut log = Log::default();
    for (header, frames, damage) in files {
        log.generation = log.generation.max(header.generation);
        log.frames.retain(|f| f.lsn < header.base);
        log.frames.extend(frames);
        log.damage.extend(damage);
    }
    Ok(log)
}

/// An I/O error on `path` (out of space: [`JournalError::Full`]).
fn io_error(what: &str, path: &Path, e: io::Error) -> JournalError {
    storage(format!("{what} {}: {e}", path.display()))
}

/// Where frames are written: both files, open, and the position in the
/// current one. Owned by the writer thread.
pub(crate) struct Wal {
    /// The two files (see [`FILE_NAMES`]).
    pub files: [Arc<File>; 2],
    paths: [PathBuf; 2],
    /// The file being written.
    active: usize,
    /// Where the next frame goes in it.
    pos: u64,
    salt: u64,
    generation: u64,
    /// The lsn of the next frame.
    next_lsn: u64,
    /// The last lsn written to each file since it got its current header
    /// (0: none).
    last_in: [u64; 2],
    /// Frame bytes (reused).
    buf: Vec<u8>,
    /// Bytes after which the writer moves to the other file ([`FILE_BYTES`]).
    file_bytes: u64,
    /// Test hook: fail the next write.
    #[cfg(test)]
    pub fail_next: bool,
}

impl Wal {
    /// Opens the files in `dir`, emptied and zero-filled (creating them if
    /// needed), and starts a new chain in the first: generation
    /// `after_generation + 1`, base `next_lsn`. Every frame already in the
    /// files must be applied to the tables before this: they are erased.
    ///
    /// # Errors
    /// [`JournalError::Storage`] when a file cannot be created, filled,
    /// written or synced.
    #[cfg(test)]
    pub(crate) fn open(
        dir: &Path,
        after_generation: u64,
        next_lsn: u64,
    ) -> Result<Self, JournalError> {
        Self::open_sized(dir, after_generation, next_lsn, FILE_BYTES)
    }

    /// [`Wal::open`] with files of `file_bytes` (tests of the move between files).
    pub(crate) fn open_sized(
        dir: &Path,
        after_generation: u64,
        next_lsn: u64,
        file_bytes: u64,
    ) -> Result<Self, JournalError> {
        let paths = FILE_NAMES.map(|n| dir.join(n));
        // Every frame in the files is applied: they are emptied and filled
        // again, in page-sized writes (see `zero_fill`).
        let open = |path: &Path| -> Result<Arc<File>, JournalError> {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(path)
                .map_err(|e| io_error("cannot open", path, e))?;
            zero_fill(&file, file_bytes).map_err(|e| io_error("cannot fill", path, e))?;
            Ok(Arc::new(file))
        };
        let files = [open(&paths[0])?, open(&paths[1])?];
        #[cfg(test)]
        if FAIL_OPEN_AFTER_EMPTYING.with(|f| f.replace(false)) {
            return Err(JournalError::Storage(
                "injected failure after emptying the WAL".into(),
            ));
        }
        // The files' directory entries, durably.
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_error("cannot sync", dir, e))?;
        let mut wal = Wal {
            files,
            paths,
            active: 1,
            pos: 0,
            salt: 0,
            generation: after_generation,
            next_lsn,
            last_in: [0, 0],
            buf: Vec::with_capacity(64 << 10),
            file_bytes,
            #[cfg(test)]
            fail_next: false,
        };
        wal.restart(0)?;
        Ok(wal)
    }

    /// The lsn the next frame gets.
    pub(crate) fn next_lsn(&self) -> u64 {
        self.next_lsn
    }

    /// Starts a new chain in file `index` at the next lsn, durably, with
    /// nothing in it yet. Every frame in either file must be applied (or
    /// discarded) before this.
    pub(crate) fn restart(&mut self, index: usize) -> Result<(), JournalError> {
        self.buf.clear();
        self.generation += 1;
        self.salt = rand::random();
        put_header(
            &mut self.buf,
            Header {
                generation: self.generation,
                salt: self.salt,
                base: self.next_lsn,
            },
        );
        let file = &self.files[index];
        let path = &self.paths[index];
        file.write_all_at(&self.buf, 0)
            .and_then(|()| file.sync_data())
            .map_err(|e| io_error("cannot write", path, e))?;
        self.active = index;
        self.pos = HEADER_LEN as u64;
        self.last_in = [0, 0];
        Ok(())
    }

    /// Writes `records` as the next frame (not yet durable: see `sync.rs`).
    /// `applied` is the last lsn the tables hold: the writer moves to the
    /// other file when the current one is full and every frame in the other
    /// is applied. Returns the frame's lsn and the file written.
    ///
    /// # Errors
    /// [`JournalError::Storage`] when the write fails; the frame may be
    /// partly written, and the caller must [`restart`](Wal::restart) after
    /// applying what was acknowledged.
    pub(crate) fn append(
        &mut self,
        records: &[u8],
        applied: u64,
    ) -> Result<(u64, usize), JournalError> {
        self.buf.clear();
        let other = 1 - self.active;
        if self.pos >= self.file_bytes && self.last_in[other] <= applied {
            // The other file's frames are all in the tables: a new chain
            // there, whose header goes with its first frame.
            self.generation += 1;
            self.salt = rand::random();
            put_header(
                &mut self.buf,
                Header {
                    generation: self.generation,
                    salt: self.salt,
                    base: self.next_lsn,
                },
            );
            self.active = other;
            self.pos = 0;
        }
        let lsn = self.next_lsn;
        put_frame(&mut self.buf, lsn, self.salt, records);
        #[cfg(test)]
        if std::mem::take(&mut self.fail_next) {
            return Err(JournalError::Storage("injected WAL write failure".into()));
        }
        let (file, path) = (&self.files[self.active], &self.paths[self.active]);
        file.write_all_at(&self.buf, self.pos)
            .map_err(|e| io_error("cannot write", path, e))?;
        self.pos += self.buf.len() as u64;
        self.last_in[self.active] = lsn;
        self.next_lsn += 1;
        Ok((lsn, self.active))
    }

    /// [`Wal::restart`] in the file being written.
    pub(crate) fn restart_here(&mut self) -> Result<(), JournalError> {
        self.restart(self.active)
    }

    /// After a failure: the lsn of the next frame, all before it applied.
    pub(crate) fn rewind(&mut self, next_lsn: u64) {
        self.next_lsn = next_lsn;
    }
}

/// Writes zeros to the empty `file` up to `len` bytes, then syncs it.
///
/// In writes of one 4 KiB page: the page cache keeps what a write fills in
/// folios of that write's size, and writeback writes whole folios. Filled in
/// large writes (or read back with readahead), a file sits in large folios,
/// and every small frame written later dirties one: each `fdatasync` then
/// wrote up to 1 MiB for a few KiB of frames (Linux 6.18, ext4).
fn zero_fill(file: &File, len: u64) -> io::Result<()> {
    const PAGE: usize = 4096;
    let zeros = [0u8; PAGE];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(PAGE as u64) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    file.sync_all()
}

/// The storage error of a failed `fdatasync` of WAL file `index`.
pub(crate) fn sync_error(index: usize, e: &io::Error) -> JournalError {
    storage(format!(
        "cannot make the write-ahead log durable ({}): {e}",
        FILE_NAMES[index]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(dir: &Path, i: usize) -> Vec<u8> {
        std::fs::read(dir.join(FILE_NAMES[i])).expect("read")
    }

    #[test]
    fn frames_round_trip_and_a_torn_frame_ends_the_chain() -> Result<(), JournalError> {
        let dir = tempfile::tempdir().map_err(storage)?;
        let mut wal = Wal::open(dir.path(), 0, 1)?;
        assert_eq!(wal.append(b"one", 0)?, (1, 0));
        assert_eq!(wal.append(b"", 0)?, (2, 0));
        assert_eq!(wal.append(b"three", 0)?, (3, 0));
        let log = read(dir.path())?;
        let lsns: Vec<u64> = log.frames.iter().map(|f| f.lsn).collect();
        assert_eq!(lsns, [1, 2, 3]);
        assert_eq!(log.frames[2].records, b"three");
        assert_eq!(log.after(1, dir.path(), false)?.len(), 2);
        let b = bytes_of(dir.path(), 0);
        let frames_of = |b: &[u8]| chain(b).map(|(_, f)| f.len());
        assert_eq!(frames_of(&b), Some(3));
        // Frame 3 starts after frames 1 (3 bytes) and 2 (none).
        let third = HEADER_LEN + 2 * FRAME_HEAD + 3;
        let mut flipped = b.clone();
        flipped[third + FRAME_HEAD + 4] ^= 1;
        assert_eq!(
            frames_of(&flipped),
            Some(2),
            "a bit flipped in frame 3's records"
        );
        assert_eq!(
            frames_of(&b[..third + FRAME_HEAD + 2]),
            Some(2),
            "frame 3 torn"
        );
        let mut flipped = b.clone();
        flipped[third + 8] ^= 1;
        assert_eq!(frames_of(&flipped), Some(2), "frame 3's lsn");
        let mut flipped = b.clone();
        flipped[HEADER_LEN + FRAME_HEAD] ^= 1;
        assert_eq!(
            frames_of(&flipped),
            Some(0),
            "a bit flipped in frame 1's records"
        );
        let mut flipped = b;
        flipped[20] ^= 1;
        assert_eq!(frames_of(&flipped), None, "the header's salt");
        Ok(())
    }

    #[test]
    fn a_new_chain_replaces_frames_from_its_base_on() -> Result<(), JournalError> {
        let dir = tempfile::tempdir().map_err(storage)?;
        let mut wal = Wal::open(dir.path(), 0, 10)?;
        for i in 0..5u8 {
            wal.append(&[i], 0)?;
        }
        // Frames 13 and 14 failed: a new chain from 13 in the other file.
        wal.rewind(13);
        wal.restart(1)?;
        wal.append(b"new13", 0)?;
        let log = read(dir.path())?;
        let got: Vec<(u64, Vec<u8>)> = log
            .frames
            .iter()
            .map(|f| (f.lsn, f.records.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (10, vec![0]),
                (11, vec![1]),
                (12, vec![2]),
                (13, b"new13".to_vec())
            ]
        );
        assert_eq!(log.generation, 2);
        // Frames from 12 on only: commit 11 is missing.
        assert!(log.after(9, dir.path(), false).is_ok());
        let mut broken = Log::default();
        broken.frames.push(Frame {
            lsn: 12,
            records: Vec::new(),
        });
        assert!(broken.after(10, dir.path(), false).is_err());
        assert!(broken.after(11, dir.path(), false).is_ok());
        Ok(())
    }

    #[test]
    fn a_full_file_moves_on_only_once_the_other_is_applied() -> Result<(), JournalError> {
        let dir = tempfile::tempdir().map_err(storage)?;
        let mut wal = Wal::open(dir.path(), 0, 1)?;
        let big = vec![7u8; (FILE_BYTES / 2) as usize];
        assert_eq!(wal.append(&big, 0)?.1, 0);
        assert_eq!(wal.append(&big, 0)?.1, 0);
        // File 0 is full; file 1 holds nothing unapplied: move.
        assert_eq!(wal.append(b"x", 0)?, (3, 1));
        assert_eq!(wal.append(&big, 0)?.1, 1);
        assert_eq!(wal.append(&big, 0)?.1, 1);
        // File 1 is full, but file 0's frames (1, 2) are not applied yet.
        assert_eq!(wal.append(b"y", 1)?, (6, 1));
        assert_eq!(wal.append(b"z", 2)?, (7, 0));
        let log = read(dir.path())?;
        let lsns: Vec<u64> = log.frames.iter().map(|f| f.lsn).collect();
        assert_eq!(lsns, [3, 4, 5, 6, 7]);
        assert_eq!(log.after(2, dir.path(), false)?.len(), 5);
        assert!(log.after(1, dir.path(), false).is_err());
        Ok(())
    }

    #[test]
    fn a_break_in_the_lsns_cuts_the_log_under_async_and_is_damage_under_sync(
    ) -> Result<(), JournalError> {
        let dir = tempfile::tempdir().map_err(storage)?;
        let mut wal = Wal::open(dir.path(), 0, 1)?;
        for i in 0..5u8 {
            wal.append(&[i], 0)?;
        }
        // File 1's chain starts at 8: frames 6 and 7 (the end of file 0)
        // were lost, as an async power loss can leave it.
        wal.rewind(8);
        wal.restart(1)?;
        wal.append(b"8", 0)?;
        wal.append(b"9", 0)?;
        let log = read(dir.path())?;
        let lsns = |f: &[Frame]| f.iter().map(|f| f.lsn).collect::<Vec<u64>>();
        assert_eq!(lsns(&log.frames), [1, 2, 3, 4, 5, 8, 9]);
        assert_eq!(lsns(log.after(0, dir.path(), true)?), [1, 2, 3, 4, 5]);
        assert_eq!(lsns(log.after(3, dir.path(), true)?), [4, 5]);
        // The break right after `applied`: nothing follows it.
        assert!(log.after(5, dir.path(), true)?.is_empty());
        // Past the break, the frames follow `applied` again.
        assert_eq!(lsns(log.after(7, dir.path(), true)?), [8, 9]);
        for applied in [0, 3, 5] {
            let refused = log.after(applied, dir.path(), false);
            assert!(
                matches!(&refused, Err(JournalError::Storage(m)) if m.contains("commit 6 is missing")),
                "{refused:?}"
            );
        }
        assert_eq!(lsns(log.after(7, dir.path(), false)?), [8, 9]);
        Ok(())
    }

    /// A WAL with frames 1..=4 (records `frame-1` .. `frame-4`, 64 bytes
    /// each) in file 0, and the offset of frame `n`.
    fn four_frames(dir: &Path) -> Result<impl Fn(usize) -> usize, JournalError> {
        let mut wal = Wal::open(dir, 0, 1)?;
        for i in 1..=4 {
            wal.append(format!("frame-{i}-{}", "x".repeat(56)).as_bytes(), 0)?;
        }
        Ok(|n: usize| HEADER_LEN + (n - 1) * (FRAME_HEAD + 64))
    }

    fn flip(dir: &Path, at: usize) {
        let path = dir.join(FILE_NAMES[0]);
        let mut b = std::fs::read(&path).expect("read");
        b[at] ^= 0x40;
        std::fs::write(&path, b).expect("write");
    }

    /// A frame in the middle of the log that does not verify, with whole
    /// frames of the same chain after it, is damage (acknowledged commits
    /// behind it), not a torn tail: refused, naming the file, the offset and
    /// the lsns; cut only after an unclean async run; harmless once the
    /// frames behind it are in the tables.
    #[test]
    fn a_damaged_frame_with_later_frames_of_its_chain_is_refused() -> Result<(), JournalError> {
        let dir = tempfile::tempdir().map_err(storage)?;
        let offset = four_frames(dir.path())?;
        flip(dir.path(), offset(2) + FRAME_HEAD + 10);
        let log = read(dir.path())?;
        let refused = log.after(0, dir.path(), false);
        let said = match &refused {
            Err(JournalError::Storage(m)) => m.clone(),
            other => panic!("a damaged frame 2 with frames 3 and 4 after it: {other:?}"),
        };
        let path = dir.path().join(FILE_NAMES[0]);
        for part in [
            format!("{} is damaged at byte {}", path.display(), offset(2)),
            "the frame of commit 2".to_owned(),
            format!("commit 4 of the same log follows at byte {}", offset(4)),
            "commits 2 to 4 would be lost".to_owned(),
            "backup".to_owned(),
            format!("truncate -s {} ", offset(2)),
        ] {
            assert!(said.contains(&part), "{part:?} in {said}");
        }
        // The same through `pending`, as the start and `journal check` call it.
        assert!(log.pending(1, true, dir.path(), false).is_err());
        // Commits 2 to 4 in the tables already: nothing is lost.
        assert!(log.after(4, dir.path(), false)?.is_empty());
        // After an unclean async run: cut at the bad frame.
        assert_eq!(log.after(0, dir.path(), true)?.len(), 1);
        // A damaged frame head (its lsn) is found the same way.
        let dir = tempfile::tempdir().map_err(storage)?;
        let offset = four_frames(dir.path())?;
        flip(dir.path(), offset(3) + 8);
        let log = read(dir.path())?;
        let refused = log.after(0, dir.path(), false);
        assert!(
            matches!(&refused, Err(JournalError::Storage(m)) if m.contains("the frame of commit 3")),
            "{refused:?}"
        );
        Ok(())
    }

    /// A torn tail (the last frame damaged, garbage or zeros after it) and
    /// frames of an earlier chain (another salt) after the chain's end are
    /// no damage: the log ends there, as before.
    #[test]
    fn a_torn_tail_and_an_earlier_chains_frames_end_the_log_quietly() -> Result<(), JournalError> {
        let dir = tempfile::tempdir().map_err(storage)?;
        let offset = four_frames(dir.path())?;
        flip(dir.path(), offset(4) + FRAME_HEAD + 3);
        let path = dir.path().join(FILE_NAMES[0]);
        let mut b = std::fs::read(&path).map_err(storage)?;
        let end = offset(5);
        for (i, x) in b[end..end + 500].iter_mut().enumerate() {
            *x = (i * 7 + 3) as u8;
        }
        std::fs::write(&path, b).map_err(storage)?;
        let log = read(dir.path())?;
        assert_eq!(log.after(0, dir.path(), false)?.len(), 3);
        // A new chain over the first frames of an earlier one: the earlier
        // chain's frames behind it have another salt.
        let dir = tempfile::tempdir().map_err(storage)?;
        let mut wal = Wal::open(dir.path(), 0, 1)?;
        for i in 1..=4u8 {
            wal.append(&[i; 64], 0)?;
        }
        wal.rewind(3);
        wal.restart_here()?;
        wal.append(b"3", 0)?;
        let log = read(dir.path())?;
        let lsns: Vec<u64> = log
            .after(2, dir.path(), false)?
            .iter()
            .map(|f| f.lsn)
            .collect();
        assert_eq!(lsns, [3]);
        Ok(())
    }
}
