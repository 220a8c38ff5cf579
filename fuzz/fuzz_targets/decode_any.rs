//! Every dialect (the third byte picks one of `Dialect::ALL`, so dialects added later are
//! covered too), every framing: whole and split decoding agree.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tokentap_fuzz::check_any_dialect(data));
