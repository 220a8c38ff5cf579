//! The rate limits read from an upstream's response head (`observe::rate_limits`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tokentap_fuzz::check_rate_limits(data));
