/**
 * Cursor stores: where subscriptions and joins persist the position of the last update they
 * handed to the caller.
 *
 * @module
 */

import type { CursorStore } from "./types.js";

/**
 * A {@link CursorStore} over the browser's `localStorage` (or any `Storage`-like object):
 * keys are prefixed with `prefix` (default `"gapless:"`). Writes that fail (quota, private
 * mode) are ignored: the subscription goes on, a reload then resumes from an older position
 * and, the cursor being older, nothing is lost.
 *
 * @param storage the storage to use (default `globalThis.localStorage`).
 * @throws {TypeError} when no storage is given and the platform has no `localStorage`.
 */
export function localStorageStore(
  storage?: Pick<Storage, "getItem" | "setItem">,
  prefix = "gapless:",
): CursorStore {
  const s = storage ?? (globalThis as { localStorage?: Storage }).localStorage;
  if (!s) throw new TypeError("localStorageStore: this platform has no localStorage; pass a storage");
  return {
    get: (key) => s.getItem(prefix + key),
    set: (key, cursor) => {
      try {
        s.setItem(prefix + key, cursor);
      } catch {
        /* quota or private mode: keep going with the older stored position */
      }
    },
  };
}

/** A {@link CursorStore} in memory (a `Map`), e.g. for tests or a server-side process. */
export function memoryStore(initial?: Iterable<[string, string]>): CursorStore & { map: Map<string, string> } {
  const map = new Map<string, string>(initial);
  return { map, get: (k) => map.get(k) ?? null, set: (k, v) => void map.set(k, v) };
}
