//! The Lua scripts that own every change to a channel in Redis.
//!
//! A channel is one Redis hash, `gapless:{<channel>}` (the braces are a hash
//! tag: on Redis Cluster every key of a channel is in one slot), and, when
//! it has metadata ([`gapless_core::meta`]), a second one,
//! `gapless:{<channel>}:meta` (fields: `META`), which `APPEND` reads for its
//! `closed` flag and `CHANGE` compares and sets. The channel hash's fields:
//!
//! | field | value |
//! |---|---|
//! | `epoch` | the channel's epoch, a u64 in decimal (kept as a string) |
//! | `floor`, `head` | oldest retained seq (`head + 1` when none), newest seq |
//! | `time` | commit time of the newest event, Unix ms (times never go back) |
//! | `lin` | `master_replid` of the Redis primary that last touched the channel |
//! | `prev_epoch`, `fork` | after a fork (a failover, a restart from an RDB snapshot, or a loss a node noticed): the epoch before it, and the last seq both histories share; positions up to `fork` of `prev_epoch` continue in `epoch` |
//! | `e<seq>` | one event: `<time>:` then the payload (see `codec.rs`) |
//! | `k<key>` | idempotency key: `<first>:<last>` seqs of the append it named; `<key>` is the client's `Idempotency-Key` (visible ASCII, kept as long as its events), or a space and the token the node drew for a request without one (kept for the token lifetime) |
//! | `r<key>` | for a client's key: the token of the request that wrote it (so that request, sent again, is told the append was its own, not a duplicate); forgotten after the token lifetime, the key itself stays as long as its events |
//! | `i<last>` | the key whose append ended at seq `last` (to forget it, and its `r`, with its events) |
//! | `tok` | `<seq>:<lifetime ms>:<until>`: no append before `seq` still has its request token (a node's `k <token>` and `i`, a client key's `r`); the token lifetime in force until Unix ms `until` (see `forget_tokens`) |
//! | `bytes` | `<floor>:<head>:<n>`: the data of events `floor..=head` adds up to `n` bytes; written by the scripts of a channel with a byte limit, and counted again from the events when it names another range (a script without the limit, or of an older version, changed the channel without it) |
//!
//! Everything of a channel's history lives in one key so that it is lost
//! whole or not at all (the metadata hash is lost with it under a FLUSHALL
//! or a restart without persistence; eviction, which could take one alone,
//! is what `maxmemory-policy noeviction` rules out, `settings.rs`): a FLUSHALL, an eviction under `maxmemory` or a restart without
//! persistence removes the `epoch` with the events, and the next script to
//! touch the channel draws a new epoch (subscribers get an `epoch` gap).
//!
//! Every script first runs `LOAD` (the prelude): it creates the channel with
//! the caller's fresh epoch when the hash is missing, applies the fork rules
//! (the channel gets a new epoch, keeping as `fork` the last seq both
//! histories share, when its data may be older than what was acknowledged:
//! last touched by the primary this one was promoted from; or by this Redis
//! before it restarted without an AOF, so from an RDB snapshot; or older than
//! what the calling node already delivered), applies the channel's
//! retention (the caller's, its namespace's: events older than the age
//! limit, beyond the count limit, or whose data passes the byte limit go;
//! so a lower limit applies to the events a channel already holds at the
//! first script that touches it), and forgets the last request tokens of a channel no
//! append touched for their lifetime (`forget_tokens`). Scripts call `TIME`
//! and `INFO`, so they rely on effect replication (the default since Redis
//! 5).

/// Shared by every script: helpers and `load(k, fresh, max_age, known,
/// max_events, max_bytes)`, which returns `epoch, floor, head, time, prev
/// epoch, fork, bytes` (`bytes`: the data bytes of `floor..=head`, when
/// `max_bytes` is not 0). `max_events`, `max_bytes` (0 or absent: no limit)
/// and `max_age` (0: none) are the channel's retention. `known` is
/// what the calling node last delivered of the channel,
/// `<epoch>:<head>:<commit time of the event at head, or empty>` (`""`:
/// nothing). The `#!lua` line makes Redis refuse the whole script up front
/// when it is out of memory, rather than fail its writes one by one, so a
/// batch is never half applied.
const PRELUDE: &str = r#"#!lua
local function S(n) return string.format('%d', n) end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function drop(k, from, to)
  for s = from, to do
    local ss = S(s)
    redis.call('HDEL', k, 'e' .. ss)
    local key = redis.call('HGET', k, 'i' .. ss)
    if key then redis.call('HDEL', k, 'i' .. ss, 'k' .. key, 'r' .. key) end
  end
end
local function event_time(k, s)
  local v = redis.call('HGET', k, 'e' .. S(s))
  return v and tonumber(string.match(v, '^(%d+):'))
end
-- the length of an event's data in its stored value (`codec.rs`):
-- `<time>:n<data>`, `<time>:b<data>`, or `<time>:t<type length>:<type><data>`
-- (`B` for bytes with a type)
local function data_len(v)
  local tl, at = string.match(v, '^%d+:[tB](%d+):()')
  if tl then return #v - at + 1 - tonumber(tl) end
  return #v - string.find(v, ':', 1, true) - 1
end
-- the data bytes of events floor..head, and whether `bytes` said so (else
-- they are counted from the events)
local function bytes_of(k, floor, head)
  local v = redis.call('HGET', k, 'bytes')
  if v then
    local f, h, n = string.match(v, '^(%d+):(%d+):(%d+)$')
    if f and tonumber(f) == floor and tonumber(h) == head then return tonumber(n), true end
  end
  local n = 0
  for s = floor, head do
    local e = redis.call('HGET', k, 'e' .. S(s))
    if e then n = n + data_len(e) end
  end
  return n, false
end
-- the count and byte limits on floor..head (`n`: the bytes of their data,
-- when max_bytes > 0): drops what they evict (the newest event always
-- stays) and returns the new floor and bytes
local function trim(k, floor, head, max_events, max_bytes, n)
  local f = floor
  if max_events > 0 and head - max_events + 1 > f then
    local cf = head - max_events + 1
    if max_bytes > 0 then
      for s = f, cf - 1 do
        local v = redis.call('HGET', k, 'e' .. S(s))
        if v then n = n - data_len(v) end
      end
    end
    f = cf
  end
  if max_bytes > 0 then
    while n > max_bytes and f < head do
      local v = redis.call('HGET', k, 'e' .. S(f))
      if v then n = n - data_len(v) end
      f = f + 1
    end
  end
  if f > floor then drop(k, floor, f - 1) end
  return f, n
end
-- the newest seq at or below `top` whose event was committed at or before
-- `t` (`floor - 1` when none): times never go back within a channel, so
-- the events up to it are older than `t`, the ones after it newer
local function older_until(k, floor, top, t)
  local lo, hi = floor - 1, top
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    local mt = event_time(k, mid)
    if mt and mt <= t then lo = mid else hi = mid - 1 end
  end
  return lo
end
-- Request tokens (`APPEND`) are needed only while their request may be
-- sent again, so they are forgotten after a lifetime. `tok` is `<lo>:<life
-- ms>:<until>`: no append before seq `lo` still has its token; `life` is
-- the lifetime in force, honoured until `until` (Unix ms). Every append
-- asking for lifetime L at time t keeps `until >= t + L` and, while `until`
-- has not passed, `life >= L`; once it has passed, no token is still within
-- the lifetime its append asked for, and the next append's lifetime takes
-- over. `forget_tokens` walks up from `lo` (never below `floor`: `drop`
-- forgets tokens with their events) to at most `top`, at most `budget`
-- seqs, forgetting the tokens of the appends committed more than `life`
-- before `now`: a node's token (`k <token>` and its `i<last>`) whole, only
-- the `r<key>` of a client's key (the key answers the client's own retries
-- as long as its events are retained, docs/api.md). `asked`: the lifetime
-- the caller's own new token needs (nil: it adds none). Writes `tok` only
-- when it changes.
local function forget_tokens(k, v, floor, top, now, asked, budget)
  local lo, life, till = floor, 0, 0
  if v then
    local a, b, c = string.match(v, '^(%d+):(%d+):(%d+)$')
    if a then lo, life, till = tonumber(a), tonumber(b), tonumber(c) end
  end
  if asked then
    if now > till or asked > life then life = asked end
    if now + asked > till then till = now + asked end
  end
  if lo < floor then lo = floor end
  local hi = math.min(top, lo + budget - 1)
  local upto = lo - 1
  if hi >= lo and life > 0 then
    -- times never go back within a channel: every event up to the newest
    -- one older than the cutoff is older too. An append mostly finds one
    -- or two seqs newly past the lifetime: step through the first few
    -- (each step reads an event), then bisect the rest
    local cutoff = now - life
    local s = lo
    while s <= hi and s < lo + 4 do
      local t = event_time(k, s)
      if not (t and t <= cutoff) then break end
      upto = s
      s = s + 1
    end
    if s == lo + 4 and upto < hi then
      local t = event_time(k, hi)
      if t and t <= cutoff then upto = hi else upto = older_until(k, upto + 1, hi, cutoff) end
    end
  end
  for s = lo, upto do
    local ss = S(s)
    local key = redis.call('HGET', k, 'i' .. ss)
    if key then
      if string.sub(key, 1, 1) == ' ' then
        redis.call('HDEL', k, 'i' .. ss, 'k' .. key)
      else
        redis.call('HDEL', k, 'r' .. key)
      end
    end
  end
  local nv = S(upto + 1) .. ':' .. S(life) .. ':' .. S(till)
  if nv ~= v then redis.call('HSET', k, 'tok', nv) end
end
local function load(k, fresh, max_age, known, max_events, max_bytes)
  max_events, max_bytes = max_events or 0, max_bytes or 0
  local m = redis.call('HMGET', k, 'epoch', 'floor', 'head', 'time', 'lin', 'prev_epoch', 'fork', 'tok')
  local info = redis.call('INFO', 'replication')
  local rid = string.match(info, 'master_replid:(%w+)') or ''
  local rid2 = string.match(info, 'master_replid2:(%w+)') or ''
  if not m[1] then
    redis.call('DEL', k)
    redis.call('HSET', k, 'epoch', fresh, 'floor', 1, 'head', 0, 'time', 0, 'lin', rid)
    return fresh, 1, 0, 0, '', 0, 0
  end
  local epoch, floor, head, time = m[1], tonumber(m[2]), tonumber(m[3]), tonumber(m[4])
  local prev, fork = m[6] or '', tonumber(m[7] or '0')
  if m[5] ~= rid then
    if m[5] == rid2 and not string.match(rid2, '^0+$') then
      -- promoted from the primary that last wrote here: it may lack that
      -- primary's newest events, so this is another incarnation; the events
      -- it has (up to `fork`) are the old primary's, so positions up to
      -- `fork` of the old epoch continue in the new one
      prev, fork = m[1], head
      epoch = fresh
      redis.call('HSET', k, 'epoch', fresh, 'prev_epoch', prev, 'fork', S(fork))
    elseif string.match(redis.call('INFO', 'persistence'), 'aof_enabled:0') then
      -- this Redis restarted (its replication ID changed) without an AOF:
      -- the channel came back from an RDB snapshot, which may lack the
      -- newest events; the ones it has are as they were
      prev, fork = m[1], head
      epoch = fresh
      redis.call('HSET', k, 'epoch', fresh, 'prev_epoch', prev, 'fork', S(fork))
    end
    redis.call('HSET', k, 'lin', rid)
  end
  local ke, kh, kt = string.match(known or '', '^(%d+):(%d+):(%d*)$')
  if ke and ke == epoch then
    -- the caller delivered this epoch up to seq kh (committed at kt): a
    -- head behind it, or another event at kh, means this Redis lost events
    -- it had acknowledged (an older AOF or snapshot under the same epoch)
    kh, kt = tonumber(kh), tonumber(kt)
    local lost = head < kh
    if not lost and kt and kh >= floor then
      -- `time` is the commit time of the event at the head: no read then
      local t = time
      if kh ~= head then t = event_time(k, kh) end
      lost = t ~= nil and t ~= kt
    end
    if lost then
      prev = epoch
      if kt then
        fork = older_until(k, floor, math.min(head, kh), kt)
      else
        fork = floor - 1
      end
      epoch = fresh
      redis.call('HSET', k, 'epoch', fresh, 'prev_epoch', prev, 'fork', S(fork))
    end
  end
  local n, counted = 0, true
  if max_bytes > 0 then n, counted = bytes_of(k, floor, head) end
  local was = floor
  if max_age > 0 and floor <= head then
    local cutoff = now_ms() - max_age
    local f = floor
    local budget = 10000
    while f <= head and budget > 0 do
      local v = redis.call('HGET', k, 'e' .. S(f))
      local t = v and tonumber(string.match(v, '^(%d+):'))
      if t and t > cutoff then break end
      if v and max_bytes > 0 then n = n - data_len(v) end
      f = f + 1
      budget = budget - 1
    end
    if f > floor then
      drop(k, floor, f - 1)
      floor = f
    end
  end
  floor, n = trim(k, floor, head, max_events, max_bytes, n)
  if floor ~= was then redis.call('HSET', k, 'floor', S(floor)) end
  if max_bytes > 0 and (floor ~= was or not counted) then
    redis.call('HSET', k, 'bytes', S(floor) .. ':' .. S(head) .. ':' .. S(n))
  end
  if m[8] then
    -- a channel no append touched for its token lifetime: the appends
    -- forget tokens as they come, so this forgets the last ones, once
    local lo, till = string.match(m[8], '^(%d+):%d+:(%d+)$')
    if lo and tonumber(lo) <= head then
      local now = now_ms()
      if now > tonumber(till) then forget_tokens(k, m[8], floor, head, now, nil, 1000) end
    end
  end
  return epoch, floor, head, time, prev, fork, n
end
"#;

/// `APPEND`: KEYS[1] = channel hash, KEYS[2] = its metadata hash
/// (`gapless:{<channel>}:meta`, see `META`; a caller that passes only
/// KEYS[1], as the benchmark does, gets `KEYS[1]:meta`); ARGV = channel,
/// idempotency key (`""`
/// for none; see below), max events (0: no count limit), max age ms, fresh
/// epoch, bus channel, inline bytes, known (see `load`), token lifetime ms
/// (see below), max bytes (the byte limit of retention, 0: none), then one
/// payload per event. Returns `{epoch, first, last, duplicate (0/1), floor,
/// head, time, prev epoch ("" for none), fork, own (0/1)}`, or `{"closed"}`
/// when the channel's metadata says it is closed (nothing appended). Seq
/// assignment, the idempotency check, the closed check, retention by count,
/// age and bytes, the append and the notification happen in this one step
/// (`append_events`, which `CHANGE` runs too). The notification carries the
/// events themselves when their
/// payloads total at most `inline bytes` (0: never), by reference otherwise
/// (format: `notification.rs`).
///
/// The key argument is what makes an append safe to send twice (the node
/// sends it again when its connection was closed under it, `conn.rs`):
/// - `<client key>` LF `<token>`: the client's `Idempotency-Key` and the
///   token the node drew for this request; the key is stored (`k`, `i`) and
///   the token with it (`r`);
/// - space `<token>`: no client key; the node's token is the key (a space
///   never starts a client's key, which is visible ASCII);
/// - `<client key>` alone, or `""` (older nodes, the benchmark): as before.
///
/// A known key answers its original seqs and appends nothing; `own` says
/// that the append it names was this very request's (its own token), sent
/// again after its answer was lost: not a duplicate for the client. The
/// closed check comes after it (a retry of an append accepted before the
/// close still answers its seqs); it is one `HGET` of the metadata hash,
/// a missing key for a channel without metadata.
///
/// `token lifetime` (ms; 0: this append forgets none) bounds what the
/// tokens cost: a request is sent again only within one request timeout of
/// its first send, so its token is needed for seconds, not as long as its
/// events. Each append forgets the tokens of the appends committed more
/// than the lifetime before it, walking at most 8 + 2 × its event count
/// seqs (so the walk keeps up with the head at O(1) per event); the
/// lifetime used is the longest any append still within its own asked for
/// (`tok`, `forget_tokens`), so nodes with different timeouts never cut
/// each other's resend window short. A channel no append touched for the
/// lifetime has its last tokens forgotten by the next script that loads it
/// (a node's poll of the channels it follows, a read).
const APPEND: &str = r#"
local k = KEYS[1]
local mk = KEYS[2] or (k .. ':meta')
return append_events(k, mk, 0, load(k, ARGV[5], tonumber(ARGV[4]), ARGV[8], tonumber(ARGV[3]), tonumber(ARGV[10])))
"#;

/// `append_events(k, mk, o, <what load returned>)`: the body of `APPEND`
/// after `load`, on the channel hash `k` and the metadata hash `mk`, with
/// `APPEND`'s arguments at `ARGV[o + 1]` … `ARGV[o + 10]` and the payloads
/// from `ARGV[o + 11]` on (`CHANGE` puts its own arguments first). Returns
/// `APPEND`'s reply.
const APPEND_EVENTS: &str = r#"
local function append_events(k, mk, o, epoch, floor, head, last, prev, fork, n)
local channel, bus = ARGV[o + 1], ARGV[o + 6]
local max_events = tonumber(ARGV[o + 3])
local max_bytes = tonumber(ARGV[o + 10])
local p = o + 11
local key, token = ARGV[o + 2], nil
local lf = string.find(key, '\n', 1, true)
if lf then
  token = string.sub(key, lf + 1)
  key = string.sub(key, 1, lf - 1)
end
if key ~= '' then
  local v = redis.call('HGET', k, 'k' .. key)
  if v then
    local a, b = string.match(v, '^(%d+):(%d+)$')
    local own = 0
    if string.sub(key, 1, 1) == ' ' or (token and redis.call('HGET', k, 'r' .. key) == token) then
      own = 1
    end
    return {epoch, tonumber(a), tonumber(b), 1, floor, head, last, prev, fork, own}
  end
end
-- a closed channel takes nothing (its metadata, `META`)
if redis.call('HGET', mk, 'closed') then return {'closed'} end
local now = now_ms()
local time = now
if last > time then time = last end
local first = head + 1
local ts = S(time) .. ':'
local size = 0
for i = p, #ARGV do
  head = head + 1
  size = size + #ARGV[i]
  local v = ts .. ARGV[i]
  if max_bytes > 0 then n = n + data_len(v) end
  redis.call('HSET', k, 'e' .. S(head), v)
end
if key ~= '' then
  redis.call('HSET', k, 'k' .. key, S(first) .. ':' .. S(head), 'i' .. S(head), key)
  if token then redis.call('HSET', k, 'r' .. key, token) end
end
floor, n = trim(k, floor, head, max_events, max_bytes, n)
if max_bytes > 0 then
  redis.call('HSET', k, 'bytes', S(floor) .. ':' .. S(head) .. ':' .. S(n))
end
local life = tonumber(ARGV[o + 9])
if life and life > 0 then
  local v = redis.call('HGET', k, 'tok')
  forget_tokens(k, v, floor, first - 1, now, life, 8 + 2 * (#ARGV - p + 1))
end
redis.call('HSET', k, 'head', S(head), 'floor', S(floor), 'time', S(time))
local note = epoch .. ' ' .. S(first) .. ' ' .. S(head) .. ' ' .. channel
if size <= tonumber(ARGV[o + 7]) then
  local parts = {note, '\n', S(floor), '\n'}
  for i = p, #ARGV do
    parts[#parts + 1] = S(#ts + #ARGV[i]) .. ':' .. ts .. ARGV[i]
  end
  note = table.concat(parts)
end
redis.call('PUBLISH', bus, note)
return {epoch, first, head, 0, floor, head, time, prev, fork, 0}
end
"#;

/// `READ`: KEYS[1] = channel hash; ARGV = fresh epoch, max age ms, after,
/// limit, max bytes (of the page), known (see `load`), max events and max
/// bytes of retention (see `load`). Returns `{epoch, floor, head, prev
/// epoch, fork, time (of the event at head), start, payload...}`: the
/// events from seq `start` on, at most `limit`, the leading ones whose data
/// (the event's `data`, not its stored value) adds up to at most `max
/// bytes`, and always the first: the rule of `Journal::read_bounded`
/// (`gapless_core::journal::cut_to_bytes`).
const READ: &str = r#"
local k = KEYS[1]
local epoch, floor, head, time, prev, fork = load(k, ARGV[1], tonumber(ARGV[2]), ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8]))
local after = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local max_bytes = tonumber(ARGV[5])
local start = after + 1
if start < floor then start = floor end
local out = {epoch, floor, head, prev, fork, S(time), start}
local bytes = 0
local s = start
while s <= head and limit > 0 do
  local v = redis.call('HGET', k, 'e' .. S(s))
  if not v then
    return redis.error_reply('gapless: event ' .. S(s) .. ' of ' .. k .. ' is missing (floor ' .. S(floor) .. ', head ' .. S(head) .. ')')
  end
  bytes = bytes + data_len(v)
  if bytes > max_bytes and s > start then break end
  out[#out + 1] = v
  s = s + 1
  limit = limit - 1
end
return out
"#;

/// `STATE`: KEYS[1] = channel hash; ARGV = fresh epoch, max age ms, known
/// (see `load`), max events, max bytes (see `load`).
/// Returns `{epoch, floor, head, prev epoch, fork}` (creating the channel, and applying
/// retention, as every script does).
const STATE: &str = r#"
local epoch, floor, head, _, prev, fork = load(KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]))
return {epoch, floor, head, prev, fork}
"#;

/// `SEEK`: KEYS[1] = channel hash; ARGV = fresh epoch, max age ms, known
/// (see `load`), time (Unix ms), max events, max bytes (see `load`). Returns `{epoch, floor, head, prev epoch,
/// fork, time (of the event at head), seq}`: `seq` is the first retained
/// event whose time is at or after the time asked (`head + 1` when none),
/// found by bisection (`older_until`: times never go back within a
/// channel), so it reads about log2(retained events) events, never the
/// whole channel (`Journal::seek_time`).
const SEEK: &str = r#"
local k = KEYS[1]
local epoch, floor, head, time, prev, fork = load(k, ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[5]), tonumber(ARGV[6]))
local t = tonumber(ARGV[4])
local seq = older_until(k, floor, head, t - 1) + 1
return {epoch, floor, head, prev, fork, S(time), seq}
"#;

/// `PURGE`: KEYS[1] = channel hash; ARGV = channel, fresh epoch (for
/// `load`), the purge's epoch, bus channel. A channel never appended to (no
/// hash) is left alone and answers `{}`. Otherwise, after `load` (so a fork
/// it finds is settled first), the hash is replaced whole by the channel's
/// new, empty epoch: `floor 1, head 0`, the same `time` (times never go
/// back) and `lin`, `prev_epoch` the epoch it replaces and `fork 0` (every
/// event of the new epoch was appended after the purge, see
/// `Journal::fork_of`). Publishes `<epoch> 1 0 <channel>` (an empty commit,
/// `notification.rs`) so every node drops what it holds of the channel.
/// Returns `{epoch, floor, head, prev epoch, fork}`. One script: an append
/// is wholly before it or wholly after it. A purge sent again (the
/// connection closed before its answer, `conn.rs`) finds the channel already
/// in the purge's epoch and changes nothing: it must not remove the events
/// appended after the first run.
const PURGE: &str = r#"
local k = KEYS[1]
if redis.call('EXISTS', k) == 0 then return {} end
if redis.call('HGET', k, 'epoch') == ARGV[3] then
  local h = redis.call('HMGET', k, 'floor', 'head', 'prev_epoch')
  return {ARGV[3], h[1], h[2], h[3] or '', 0}
end
local epoch, _, _, time = load(k, ARGV[2], 0, '')
local lin = redis.call('HGET', k, 'lin') or ''
redis.call('DEL', k)
redis.call('HSET', k, 'epoch', ARGV[3], 'floor', 1, 'head', 0, 'time', S(time), 'lin', lin,
  'prev_epoch', epoch, 'fork', 0)
redis.call('PUBLISH', ARGV[4], ARGV[3] .. ' 1 0 ' .. ARGV[1])
return {ARGV[3], 1, 0, epoch, 0}
"#;

/// `META`: KEYS[1] = channel hash, KEYS[2] = its metadata hash; ARGV =
/// fresh epoch, max age ms, known, max events, max bytes (see `load`).
/// Returns `{epoch, floor, head, prev epoch, fork, version, json}`: the
/// channel's bounds (after `load`, as `STATE`) and its metadata, read
/// together; `version` and `json` are `""` when it has none.
///
/// The metadata hash `gapless:{<channel>}:meta` (the channel's hash tag,
/// so the same slot as its events) has the fields:
///
/// | field | value |
/// |---|---|
/// | `json` | the metadata, `ChannelMeta::encode`; absent once deleted |
/// | `ver` | its version: a counter, bumped by every `CHANGE`, that starts at a random base the node draws when the hash is new (so a Redis that lost the hash and had it made again never repeats a version a node still holds) |
/// | `closed` | `1` while the metadata says closed, else absent: what `APPEND` reads |
/// | `req` | the request token of the `CHANGE` that wrote `ver` (so that request, sent again after its answer was lost, is told it was its own) |
/// | `app` | `<first>:<last>` seqs that change appended, or `""` |
///
/// `Change::Delete` leaves a tombstone (`ver`, `req`, `app` and no `json`)
/// that expires after the token lifetime, so a resent delete is still
/// known as its own and versions keep counting meanwhile; a later
/// creation makes it permanent again.
const META: &str = r#"
local epoch, floor, head, _, prev, fork = load(KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]))
local m = redis.call('HMGET', KEYS[2], 'ver', 'json')
return {epoch, floor, head, prev, fork, m[1] or '', m[2] or ''}
"#;

/// `CHANGE`: the compare-and-set of a channel's metadata with the append it
/// guards (`meta.rs`). KEYS[1] = channel hash, KEYS[2] = its metadata hash;
/// ARGV = the version the node decided against (`""`: no metadata), the
/// bounds it decided against (`<epoch>:<head>`, or `""` when the decision
/// does not depend on them), the new metadata's JSON (`""`: remove it),
/// whether it is closed (`1`/`0`), the version base for a new hash, the
/// request token, this node's name, the tombstone lifetime ms, then
/// `APPEND`'s arguments and payloads (ARGV[9] on; no payload: nothing is
/// appended). After `load`:
///
/// - another version (or other bounds): `{"own", version, epoch, first,
///   last, floor, head, prev epoch, fork}` when the current version was
///   written by this very request (`req`: sent again after its answer was
///   lost), else `{"conflict", version, json, epoch, floor, head, prev
///   epoch, fork}`: nothing written, the node decides again on these;
/// - else the events are appended by `append_events` (a `{"closed"}` or an
///   error reply from it is returned as is, nothing written), the metadata
///   hash written (or turned into a tombstone) with the version bumped, and
///   `meta <node> <channel>` published on the bus after the append's own
///   notification. Returns `{"ok", version, <APPEND's reply>}` (for no
///   events: the bounds, with zero seqs).
const CHANGE: &str = r#"
local k, mk, o = KEYS[1], KEYS[2], 8
local epoch, floor, head, last, prev, fork, n = load(k, ARGV[o + 5], tonumber(ARGV[o + 4]), ARGV[o + 8], tonumber(ARGV[o + 3]), tonumber(ARGV[o + 10]))
local m = redis.call('HMGET', mk, 'ver', 'json', 'req', 'app')
local ver = m[1] or ''
if ver ~= ARGV[1] or (ARGV[2] ~= '' and ARGV[2] ~= epoch .. ':' .. S(head)) then
  if m[3] and m[3] == ARGV[6] then
    local a, b = string.match(m[4] or '', '^(%d+):(%d+)$')
    return {'own', ver, epoch, tonumber(a or '0'), tonumber(b or '0'), floor, head, prev, fork}
  end
  return {'conflict', ver, m[2] or '', epoch, floor, head, prev, fork}
end
local r = {epoch, 0, 0, 0, floor, head, last, prev, fork, 0}
local app = ''
if #ARGV > o + 10 then
  r = append_events(k, mk, o, epoch, floor, head, last, prev, fork, n)
  if r[1] == 'closed' or r.err then return r end
  app = S(r[2]) .. ':' .. S(r[3])
end
local nv
if ver == '' then nv = tonumber(ARGV[5]) else nv = tonumber(ver) + 1 end
if ARGV[3] == '' then
  redis.call('DEL', mk)
  redis.call('HSET', mk, 'ver', S(nv), 'req', ARGV[6], 'app', app)
  redis.call('PEXPIRE', mk, ARGV[8])
else
  redis.call('HSET', mk, 'ver', S(nv), 'json', ARGV[3], 'req', ARGV[6], 'app', app)
  if ARGV[4] == '1' then
    redis.call('HSET', mk, 'closed', '1')
  elseif m[2] then
    redis.call('HDEL', mk, 'closed')
  end
  if ver ~= '' and not m[2] then redis.call('PERSIST', mk) end
end
redis.call('PUBLISH', ARGV[o + 6], 'meta ' .. ARGV[7] .. ' ' .. ARGV[o + 1])
return {'ok', S(nv), r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10]}
"#;

/// `READY`: touches nothing and returns `PONG`; the readiness check. Like
/// every script above it is declared with `#!lua` and no flags, so Redis
/// refuses it exactly when it would refuse an append before running it:
/// out of memory at `maxmemory` with `noeviction` (`OOM`), a read-only
/// replica (`READONLY`), persistence failing (`MISCONF`), loading
/// (`LOADING`). A `PING` answers in all of these.
const READY: &str = "#!lua\nreturn 'PONG'\n";

/// The scripts, compiled once (the crate sends `EVALSHA`, and the
/// source when Redis does not have it cached).
pub(crate) struct Scripts {
    pub(crate) append: redis::Script,
    pub(crate) read: redis::Script,
    pub(crate) state: redis::Script,
    pub(crate) seek: redis::Script,
    pub(crate) ready: redis::Script,
    pub(crate) purge: redis::Script,
    pub(crate) meta: redis::Script,
    pub(crate) change: redis::Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            append: redis::Script::new(&append_source()),
            read: redis::Script::new(&format!("{PRELUDE}{READ}")),
            state: redis::Script::new(&format!("{PRELUDE}{STATE}")),
            seek: redis::Script::new(&format!("{PRELUDE}{SEEK}")),
            ready: redis::Script::new(READY),
            purge: redis::Script::new(&format!("{PRELUDE}{PURGE}")),
            meta: redis::Script::new(&format!("{PRELUDE}{META}")),
            change: redis::Script::new(&format!("{PRELUDE}{APPEND_EVENTS}{CHANGE}")),
        }
    }
}

/// The Lua source of the append script (as Redis runs it).
pub(crate) fn append_source() -> String {
    format!("{PRELUDE}{APPEND_EVENTS}{APPEND}")
}

/// The Redis key of `channel`'s hash.
pub(crate) fn key_of(channel: &str) -> String {
    format!("gapless:{{{channel}}}")
}

/// The Redis key of `channel`'s metadata hash (`META`): the channel's hash
/// tag, so the same slot as [`key_of`].
pub(crate) fn meta_key_of(channel: &str) -> String {
    format!("gapless:{{{channel}}}:meta")
}

#[cfg(test)]
mod tests {
    use super::{key_of, Scripts};
    use gapless_testkit::redis::Redis;
    use redis::AsyncCommands;

    /// Runs `PURGE` on `channel` with the purge's epoch `epoch`; the answer.
    async fn purge(
        con: &mut redis::aio::MultiplexedConnection,
        channel: &str,
        epoch: &str,
    ) -> Vec<redis::Value> {
        Scripts::new()
            .purge
            .key(key_of(channel))
            .arg(channel)
            .arg("11")
            .arg(epoch)
            .arg("bus")
            .invoke_async(con)
            .await
            .expect("purge script")
    }

    /// The connection closed before a purge's answer, so it is sent again
    /// with the same epoch: the second run must keep what was appended in
    /// between (here: head 5 in the new epoch), where a purge with another
    /// epoch empties the channel.
    #[tokio::test]
    async fn a_purge_sent_again_keeps_the_events_appended_after_the_first() {
        let Some(redis) = Redis::start_or_skip("purge resend").await else {
            return;
        };
        let client = redis::Client::open(redis.url()).expect("client");
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let k = key_of("c");
        let _: () = con
            .hset_multiple(
                &k,
                &[("epoch", "7"), ("floor", "1"), ("head", "3"), ("time", "0")],
            )
            .await
            .expect("hset");
        purge(&mut con, "c", "9").await;
        let head: String = con.hget(&k, "head").await.expect("head");
        assert_eq!(head, "0", "the first purge empties the channel");
        // Appends land in the new epoch.
        let _: () = con.hset(&k, "head", "5").await.expect("hset");
        let again = purge(&mut con, "c", "9").await;
        let head: String = con.hget(&k, "head").await.expect("head");
        assert_eq!(head, "5", "a resent purge removed later events: {again:?}");
        assert_eq!(again.get(2), Some(&redis::Value::BulkString(b"5".to_vec())));
        // A new purge (another epoch) does empty it.
        purge(&mut con, "c", "13").await;
        let head: String = con.hget(&k, "head").await.expect("head");
        assert_eq!(head, "0");
    }
}
