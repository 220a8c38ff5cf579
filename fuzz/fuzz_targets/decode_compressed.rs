//! gzip / deflate / br / zstd bodies through `response_decoder`: no panic, and a body
//! accepted whole is accepted split, with the same signals.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tokentap_fuzz::check_compressed(data));
