//! The HTTP/1.1 fast path's readers: request heads are never forwarded ambiguously, and
//! chunked bodies and responses read the same however they are split.
#![no_main]

// Included by path (not through the library) so that `tests/it/fuzz_fast_path.rs` can
// include the same file next to `tests/it/fuzz_decoders.rs`'s copy of the library.
#[path = "../src/fast_path.rs"]
mod fast_path;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fast_path::check_fast_path(data));
