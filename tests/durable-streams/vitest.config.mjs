// One file of tests, run once (no watch); the suite's own timeouts apply per test.
import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["conformance.test.mjs"],
    testTimeout: 30000,
    hookTimeout: 30000,
    watch: false,
  },
});
