//! `TokenStream`: for the built-in tiktoken encodings the tokens settled by every delta
//! plus the rest at the end add up to exactly the whole text's `count_ordinary`, whatever
//! the split into deltas: between words, inside words, inside combining sequences and
//! emoji ZWJ sequences (`&str` deltas), and inside UTF-8 sequences (`push_bytes`).
//!
//! The expected counts come from `tiktoken-rs` directly, not through tokentap.

use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::sample::Index;
use tiktoken_rs::CoreBPE;
use tokentap::wire::Tokenizer;

/// Real texts of the kinds a model writes.
const SAMPLES: &[&str] = &[
    // English prose with contractions, quotes and punctuation.
    "Hello! It's nice to meet you. I'm sure you'll like it; they've said we'd go, and \
     she'll've been there. Isn't THAT the model's fault? WE'LL SEE, Ma'am. \"Quoted\", \
     (parenthesised) and rock 'n' roll, the O'Neills' dog — and “curly” quotes’ too.",
    // White space: leading, trailing, runs, tabs, CRLF, blank lines, NBSP, ideographic.
    "   leading spaces\n\n\nand   multiple   spaces\t\ttabs\r\nwindows line  \r\n\r\n  \
     indented\n \n\t\n  x  \u{a0}nbsp\u{a0} \u{3000}ideographic\u{3000}space   ",
    // Code with indentation.
    "fn main() {\n    let xs: Vec<u32> = (0..10).map(|x| x * 2).collect();\n    if xs.len() \
     > 3 {\n        println!(\"{:?}\", &xs[..3]);\n    }\n}\n\ndef f(a, b=2):\n\treturn \
     a**b  # comment\n\n\n    \nclass Foo:\n    pass\n",
    // Markdown and JSON.
    "## Steps\n\n1. **Bold** and _italic_\n2. `inline_code()` here\n- item\n  - nested\n\n\
     ```json\n{\"key\": [1, 2.5, null], \"s\": \"a\\nb\"}\n```\n> quote\n\n|a|b|\n|-|-|\n",
    // Chinese, Japanese, Korean.
    "你好，世界。我们今天学习自然语言处理：分词、编码和解码！“引号”里的内容（括号）。\
     日本語のテキストです。カタカナとひらがな、漢字が混ざっています。\
     안녕하세요, 세계! 한국어 문장입니다.",
    // Arabic, Hebrew, Hindi (combining vowel signs), Cyrillic, Greek, Thai.
    "مرحبا بالعالم، هذا نص عربي. كيف حالك؟ שלום עולם. नमस्ते दुनिया, यह हिंदी पाठ है। \
     Привет, мир! Это русский текст: съешь же ещё этих мягких французских булок. \
     Γειά σου Κόσμε. สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    // Emoji: ZWJ sequences, skin tones, flags, keycaps, variation selectors.
    "Family 👨‍👩‍👧‍👦 and 👩🏽‍💻 coding, ❤️ hearts ❤️‍🔥, flags 🇫🇷🇯🇵 🏳️‍🌈, keycap 1️⃣, \
     thumbs 👍🏻👍🏿 ok👌! 🙂🙂🙂 end🎉.",
    // Numbers of every shape.
    "Pi is 3.14159265358979, a million is 1,000,000 or 1e6; on 2026-12-01 at 12:30:45 \
     we paid $1234.56 (about €1 100) for 0x1F items, -42, +7, 50%, ١٢٣٤ and ¾ and 2³.",
    // Case mixtures and combining sequences.
    "HELLO World's NASA'S iPhone McDonald's ÉCOLE e\u{301}cole Z\u{324}\u{354}a\u{308}\
     \u{356}l\u{36e}g\u{328}o\u{317} café naïve ǅungla ﬁne Straße İstanbul ſtraſſe.",
    // Special-token text is ordinary output text.
    "Text with <|endoftext|> and <|fim_prefix|> inside, plus a/b/c paths and ../x\n/etc/\n",
];

fn expected(encoding: &str, text: &str) -> u64 {
    static O200K: OnceLock<CoreBPE> = OnceLock::new();
    static CL100K: OnceLock<CoreBPE> = OnceLock::new();
    let bpe = match encoding {
        "o200k_base" => O200K.get_or_init(|| tiktoken_rs::o200k_base().expect("o200k")),
        _ => CL100K.get_or_init(|| tiktoken_rs::cl100k_base().expect("cl100k")),
    };
    bpe.count_ordinary(text) as u64
}

const ENCODINGS: [&str; 2] = ["o200k_base", "cl100k_base"];

fn tokenizer(encoding: &str) -> Tokenizer {
    Tokenizer::encoding(encoding).expect("built-in encoding")
}

/// Sum of the stream's counts for `text` split into `&str` deltas at the char boundaries
/// at or before `cuts` (byte offsets).
fn streamed(tokenizer: &Tokenizer, text: &str, cuts: &[usize]) -> u64 {
    let mut bounds: Vec<usize> = cuts
        .iter()
        .map(|&cut| {
            let mut cut = cut.min(text.len());
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            cut
        })
        .collect();
    bounds.push(text.len());
    bounds.sort_unstable();
    let mut stream = tokenizer.stream();
    let mut sum = 0u64;
    let mut start = 0;
    for end in bounds {
        sum += u64::from(stream.push(&text[start..end]));
        start = end;
    }
    sum + u64::from(stream.finish())
}

/// The same with raw byte deltas cut at exactly `cuts`, through `push_bytes`.
fn streamed_bytes(tokenizer: &Tokenizer, text: &str, cuts: &[usize]) -> u64 {
    let bytes = text.as_bytes();
    let mut bounds: Vec<usize> = cuts.iter().map(|&cut| cut.min(bytes.len())).collect();
    bounds.push(bytes.len());
    bounds.sort_unstable();
    let mut stream = tokenizer.stream();
    let mut sum = 0u64;
    let mut start = 0;
    for end in bounds {
        sum += u64::from(stream.push_bytes(&bytes[start..end]));
        start = end;
    }
    sum + u64::from(stream.finish())
}

#[test]
fn every_sample_adds_up_char_by_char_and_byte_by_byte() {
    for encoding in ENCODINGS {
        let tokenizer = tokenizer(encoding);
        for text in SAMPLES {
            let want = expected(encoding, text);
            let chars: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
            let bytes: Vec<usize> = (0..text.len()).collect();
            assert_eq!(
                streamed(&tokenizer, text, &[]),
                want,
                "{encoding} whole: {text}"
            );
            assert_eq!(
                streamed(&tokenizer, text, &chars),
                want,
                "{encoding} chars: {text}"
            );
            assert_eq!(
                streamed_bytes(&tokenizer, text, &bytes),
                want,
                "{encoding} bytes: {text}"
            );
        }
    }
}

#[test]
fn counting_each_delta_alone_overcounts_what_the_stream_gets_right() {
    // The issue's case: one word and its trailing space per delta.
    let text = "Hi there. This is a stream of words, each with the space after it.";
    for encoding in ENCODINGS {
        let tokenizer = tokenizer(encoding);
        let deltas: Vec<&str> = text.split_inclusive(' ').collect();
        let alone: u64 = deltas.iter().map(|d| tokenizer.count(d)).sum();
        let mut stream = tokenizer.stream();
        let mut sum: u64 = deltas.iter().map(|d| u64::from(stream.push(d))).sum();
        sum += u64::from(stream.finish());
        assert_eq!(sum, expected(encoding, text), "{encoding}");
        assert!(alone > sum + 8, "{encoding}: alone {alone}, stream {sum}");
    }
}

/// One to three samples joined, so that texts of different kinds meet.
fn sample_text() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(SAMPLES), 1..4).prop_map(|parts| parts.concat())
}

/// Text from an alphabet of the characters where pre-tokenizers decide things: white
/// space of every kind, apostrophes and contractions, case changes, digits, marks,
/// punctuation that joins newlines or slashes, CJK, emoji and ZWJ.
fn tricky_text() -> impl Strategy<Value = String> {
    let atoms = prop::sample::select(
        &[
            " ", "  ", "\n", "\r\n", "\t", "\u{a0}", "\u{3000}", "'", "'s", "'LL", "'re", "’", "a",
            "Z", "x", "Ab", "CD", "\u{301}", "\u{fe0f}", "1", "23", "4567", "٣", ".", ",", "!",
            "/", "(", ")", "-", "_", "\"", "你", "好", "，", "。", "ا", "न", "\u{94d}", "ä", "👩",
            "\u{200d}", "💻", "🏽", "🇫", "$", "%", "<|", "|>",
        ][..],
    );
    prop::collection::vec(atoms, 0..60).prop_map(|atoms| atoms.concat())
}

fn cuts() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(any::<Index>(), 0..40).prop_map(|indexes| {
        // Scaled to the text later: an index picks a fraction of the text.
        indexes.into_iter().map(|i| i.index(1 << 20)).collect()
    })
}

fn scale(cuts: &[usize], len: usize) -> Vec<usize> {
    cuts.iter().map(|&c| (c * (len + 1)) >> 20).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn real_texts_add_up_for_any_split(text in sample_text(), cuts in cuts()) {
        let cuts = scale(&cuts, text.len());
        for encoding in ENCODINGS {
            let tokenizer = tokenizer(encoding);
            let want = expected(encoding, &text);
            prop_assert_eq!(streamed(&tokenizer, &text, &cuts), want, "{}", encoding);
            prop_assert_eq!(streamed_bytes(&tokenizer, &text, &cuts), want, "{}", encoding);
        }
    }

    #[test]
    fn tricky_texts_add_up_for_any_split(text in tricky_text(), cuts in cuts()) {
        let cuts = scale(&cuts, text.len());
        let chars: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        for encoding in ENCODINGS {
            let tokenizer = tokenizer(encoding);
            let want = expected(encoding, &text);
            prop_assert_eq!(streamed(&tokenizer, &text, &cuts), want, "{}", encoding);
            prop_assert_eq!(streamed(&tokenizer, &text, &chars), want, "{}", encoding);
            prop_assert_eq!(streamed_bytes(&tokenizer, &text, &cuts), want, "{}", encoding);
        }
    }
}

/// Hugging Face `tokenizer.json` files built here (no downloads). A one-entry word-level
/// vocabulary makes every pre-tokenized piece one token, so the count is the number of
/// pieces: additivity of the pre-tokenizer at the cuts is what these tests check (the
/// model encodes each piece alone, so it adds nothing across a cut).
#[cfg(feature = "tokenizers")]
mod hf {
    use super::*;

    fn load(pre_tokenizer: serde_json::Value) -> Tokenizer {
        let json = serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": null,
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}
        });
        let path = std::env::temp_dir().join(format!(
            "tokentap-token-stream-{}-{}.json",
            std::process::id(),
            pre_tokenizer_name(&json)
        ));
        std::fs::write(&path, json.to_string()).expect("write tokenizer.json");
        let tokenizer = Tokenizer::from_file(&path).expect("load tokenizer.json");
        let _ = std::fs::remove_file(&path);
        tokenizer
    }

    fn pre_tokenizer_name(json: &serde_json::Value) -> String {
        json["pre_tokenizer"]["type"]
            .as_str()
            .unwrap_or("none")
            .to_string()
    }

    /// Llama 3 style: the cl100k pattern as a `Split`, then `ByteLevel` without a prefix
    /// space.
    fn llama3() -> Tokenizer {
        load(serde_json::json!({
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
                    "behavior": "Isolated",
                    "invert": false
                },
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
            ]
        }))
    }

    /// SentencePiece style: white space becomes `▁`, prepended to the first word.
    fn metaspace() -> Tokenizer {
        load(serde_json::json!({
            "type": "Metaspace",
            "replacement": "▁",
            "prepend_scheme": "first",
            "split": true
        }))
    }

    fn whole(tokenizer: &Tokenizer, text: &str) -> u64 {
        let count = tokenizer.count(text);
        assert!(count > 0 || text.is_empty(), "no pieces in {text:?}");
        count
    }

    #[test]
    fn the_pieces_are_what_the_pre_tokenizers_make() {
        let deltas = ["Hi", " there", "."];
        let streamed = |tokenizer: &Tokenizer| {
            let mut stream = tokenizer.stream();
            let sum: u64 = deltas.iter().map(|d| u64::from(stream.push(d))).sum();
            sum + u64::from(stream.finish())
        };
        // "Hi", " there", ".": cut where the pieces are, exact.
        let llama3 = llama3();
        assert_eq!(whole(&llama3, "Hi there."), 3);
        assert_eq!(streamed(&llama3), 3);
        // "▁Hi", "▁there.": the cut before "." costs the one piece the bound allows.
        let metaspace = metaspace();
        assert_eq!(whole(&metaspace, "Hi there."), 2);
        assert_eq!(streamed(&metaspace), 3);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn a_split_and_byte_level_tokenizer_adds_up_exactly(
            text in sample_text(),
            cuts in cuts(),
        ) {
            let tokenizer = llama3();
            let cuts = scale(&cuts, text.len());
            prop_assert_eq!(streamed(&tokenizer, &text, &cuts), whole(&tokenizer, &text));
        }

        #[test]
        fn a_metaspace_tokenizer_is_off_by_at_most_one_per_delta(
            text in sample_text(),
            cuts in cuts(),
        ) {
            let tokenizer = metaspace();
            let cuts = scale(&cuts, text.len());
            let deltas = cuts.len() as u64 + 1;
            let sum = streamed(&tokenizer, &text, &cuts);
            let want = whole(&tokenizer, &text);
            prop_assert!(sum.abs_diff(want) <= deltas, "sum {} whole {} deltas {}", sum, want, deltas);
        }
    }
}
