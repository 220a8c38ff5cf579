//! The request-body scanner: split-invariant, and agrees with serde_json on `model` and
//! `stream` of any JSON object.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tokentap_fuzz::check_request_scanner(data));
