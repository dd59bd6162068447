//! Exit codes, named once.

/// Every lab passed and matched its snapshot.
pub const OK: i32 = 0;
/// A lab failed: an assertion FAIL, a snapshot mismatch, or a phase deadline.
pub const LAB_FAILED: i32 = 1;
/// Usage or environment error: nothing was proven either way.
pub const SETUP: i32 = 2;
/// A bug in mqlab itself (a panic), after teardown.
pub const INTERNAL: i32 = 101;
/// Interrupted by Ctrl-C or SIGTERM (after teardown).
pub const INTERRUPTED: i32 = 130;
