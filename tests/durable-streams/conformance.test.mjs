// The Durable Streams server conformance suite (@durable-streams/server-conformance-tests),
// run against the server at DS_URL (scripts/ds-conformance.sh starts a gapless and sets it).
// The suite's own CLI finds no tests when it sits in node_modules; this form works.
import { runConformanceTests } from "@durable-streams/server-conformance-tests";

runConformanceTests({
  baseUrl: process.env.DS_URL,
  longPollTimeoutMs: 500,
  subscriptions: true,
});
