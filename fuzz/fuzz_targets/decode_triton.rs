//! The `triton` decoder, every framing: whole and split decoding agree.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tokentap_fuzz::check_dialect("triton", data));
