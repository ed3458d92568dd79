/**
 * The common shape of every long-lived result (subscriptions, joins, session consumers): an
 * async iterator, or an event-emitter form for UI code, and `close()`.
 *
 * @module
 */

import { GaplessError } from "./errors.js";

/** A listener of an {@link UpdateStream}. */
export type Listener<T> = (value: T) => void;

/**
 * An async iterable of updates that can also push them to listeners ({@link UpdateStream.on}).
 *
 * Use one form per stream: iterate it (`for await`), or register listeners; registering the
 * first listener starts delivery (in a microtask, so several `on` calls in a row all see the
 * first update). An update counts as delivered, and its cursor is persisted, when it is handed
 * to the iterator's caller or to the listeners.
 *
 * @typeParam T the update type; its `kind` names the listener it goes to.
 */
export abstract class UpdateStream<T extends { kind: string }> implements AsyncIterable<T> {
  /** Aborted by {@link close}. */
  protected readonly abortController = new AbortController();
  #gen: AsyncGenerator<T, void, undefined> | undefined;
  #mode: "iterator" | "listeners" | undefined;
  readonly #listeners = new Map<string, Set<Listener<never>>>();
  #ended = false;

  /** The generator of updates; it must stop soon after `signal` aborts. */
  protected abstract run(signal: AbortSignal): AsyncGenerator<T, void, undefined>;

  /** Whether {@link close} was called or the stream ended. */
  get closed(): boolean {
    return this.#ended || this.abortController.signal.aborted;
  }

  #generator(): AsyncGenerator<T, void, undefined> {
    this.#gen ??= this.run(this.abortController.signal);
    return this.#gen;
  }

  /**
   * The updates, in order. Ends after {@link close}, or when the stream ends by itself; a
   * terminal failure is thrown as a {@link GaplessError}. Breaking out of `for await` closes it.
   * @throws {Error} when listeners were registered on this stream already.
   */
  [Symbol.asyncIterator](): AsyncIterator<T, void, undefined> {
    this.#claim("iterator");
    const gen = this.#generator();
    return {
      next: async () => {
        const r = await gen.next();
        if (r.done) this.#ended = true;
        return r;
      },
      return: async () => {
        this.close();
        return { done: true, value: undefined };
      },
    };
  }

  /**
   * Registers `fn` for updates of `kind` (`"update"` for every update; `"error"` for the
   * terminal {@link GaplessError}, after which the stream ends; `"end"` once it has ended).
   * The first registration starts delivery. A terminal error with no `"error"` listener is
   * thrown as an uncaught error (the browser's console, Node's `uncaughtException`).
   * @returns a function that removes the listener.
   * @throws {Error} when the stream is being iterated already.
   */
  on(kind: "error", fn: Listener<GaplessError>): () => void;
  on(kind: "end", fn: Listener<void>): () => void;
  on(kind: "update", fn: Listener<T>): () => void;
  on<K extends T["kind"]>(kind: K, fn: Listener<Extract<T, { kind: K }>>): () => void;
  on(kind: string, fn: Listener<never>): () => void {
    const first = this.#mode === undefined;
    this.#claim("listeners");
    let set = this.#listeners.get(kind);
    if (!set) this.#listeners.set(kind, (set = new Set()));
    set.add(fn);
    if (first) queueMicrotask(() => void this.#pump());
    return () => void set!.delete(fn);
  }

  /** Stops the stream at once: closes its connection; the iterator ends. Idempotent. */
  close(): void {
    if (this.abortController.signal.aborted) return;
    this.abortController.abort();
    const gen = this.#gen;
    // A generator suspended at a yield finishes now; one that is running sees the abort.
    if (gen) gen.return(undefined).catch(() => {});
  }

  #claim(mode: "iterator" | "listeners"): void {
    if (this.#mode !== undefined && this.#mode !== mode) {
      throw new Error("use either the async iterator or on(...) listeners on one stream, not both");
    }
    if (mode === "iterator" && this.#mode === "iterator") {
      throw new Error("this stream is already being iterated");
    }
    this.#mode = mode;
  }

  #emit(kind: string, value: unknown): void {
    const set = this.#listeners.get(kind);
    if (!set) return;
    for (const fn of [...set]) {
      try {
        (fn as Listener<unknown>)(value);
      } catch (e) {
        // A listener's bug must not stop delivery to the others.
        queueMicrotask(() => {
          throw e;
        });
      }
    }
  }

  async #pump(): Promise<void> {
    const gen = this.#generator();
    try {
      for (;;) {
        const r = await gen.next();
        if (r.done) break;
        this.#emit(r.value.kind, r.value);
        this.#emit("update", r.value);
      }
    } catch (e) {
      const err = e instanceof GaplessError ? e : new GaplessError({ code: "protocol", message: String(e), cause: e });
      if (this.#listeners.get("error")?.size) this.#emit("error", err);
      else {
        // Nobody listens for it: report it as an uncaught error rather than lose it.
        queueMicrotask(() => {
          throw err;
        });
      }
    }
    this.#ended = true;
    this.#emit("end", undefined);
  }
}
