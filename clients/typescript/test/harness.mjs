// The SDK's test helpers: the repository's one JavaScript test harness
// (tests/harness/gapless.mjs): run the real gapless binary ($GAPLESS_BIN) on a fixed free
// port and temp data dir, kill it with -9 and start it again on the same port; mint HS256
// tokens; wait for things; launch Chromium.

export * from '../../../tests/harness/gapless.mjs';
