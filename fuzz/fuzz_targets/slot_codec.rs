//! Index slot words: any word decodes to a slot or an error, and a slot re-encodes to itself.
#![no_main]

use dmkit_kv_index::Slot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|word: u64| {
    if let Ok(Some(s)) = Slot::from_raw(word) {
        let again = Slot::new(s.fingerprint(), s.ptr()).expect("a decoded slot re-encodes");
        assert_eq!(again, s);
        assert_eq!(Slot::from_raw(s.raw()).unwrap(), Some(s));
    }
});
