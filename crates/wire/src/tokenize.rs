//! Optional token counting for text deltas (`observe.tokenizer`).
//!
//! Several dialects batch text: an Anthropic `text_delta`, an Ollama line or a Triton
//! response can carry several tokens and the wire format does not say how many. Without
//! a tokenizer such an event counts as the documented estimate from its text's words and
//! symbols (`event_tokens`). With one,
//! the event's text (content, reasoning, refusal and tool-call arguments) is run through
//! it and the event counts as many tokens as the text encodes to. That count is still an
//! estimate, labelled as such (`Signal::Output { exact: false, .. }`): the tokenizer may
//! not be the model's, and even the model's own tokenizer may split decoded text
//! differently from how it was generated. It only replaces the text-shape estimate;
//! counts the wire format gives (logprobs entries, cumulative usage growth, one token per
//! TGI event) are never re-counted, and reported usage still corrects `N`.
//!
//! Two sources ([`TokenizerSource`]), both loaded by [`Tokenizer::load`] once the
//! configuration naming them is valid (config validation checks only the source and
//! reads nothing):
//!
//! - a built-in tiktoken encoding, `o200k_base` or `cl100k_base`: the BPE ranks ship
//!   inside the `tiktoken-rs` crate, so nothing is downloaded, ever;
//! - a Hugging Face `tokenizer.json` file, in builds with the `tokenizers` feature.
//!
//! Off by default, and then free: the decoders hold `None` and never look at the text.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use tiktoken_rs::CoreBPE;

/// Something that can count the tokens in a piece of text.
pub trait TokenCounter: Send + Sync {
    /// Tokens `text` encodes to, without any special tokens added around it.
    fn count(&self, text: &str) -> usize;
}

/// Any `Fn(&str) -> usize` counts tokens (handy in tests).
impl<F: Fn(&str) -> usize + Send + Sync> TokenCounter for F {
    fn count(&self, text: &str) -> usize {
        self(text)
    }
}

/// A shared, cheaply cloned token counter with a name for logs.
#[derive(Clone)]
pub struct Tokenizer {
    name: Arc<str>,
    counter: Arc<dyn TokenCounter>,
}

/// The built-in tiktoken encodings, by the names `observe.tokenizer.encoding` takes.
pub const ENCODINGS: [&str; 2] = ["o200k_base", "cl100k_base"];

/// Where a tokenizer comes from. Building one reads nothing; [`Tokenizer::load`] does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenizerSource {
    /// A built-in tiktoken encoding, one of [`ENCODINGS`].
    Encoding(&'static str),
    /// A Hugging Face `tokenizer.json` file.
    File(PathBuf),
}

impl TokenizerSource {
    /// The built-in encoding called `name`, or why there is none.
    pub fn encoding(name: &str) -> Result<TokenizerSource, TokenizerError> {
        ENCODINGS
            .iter()
            .find(|known| **known == name)
            .map(|known| TokenizerSource::Encoding(known))
            .ok_or_else(|| TokenizerError::UnknownEncoding(name.to_string()))
    }
}

/// Why a tokenizer could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("`{0}` is not one of `o200k_base`, `cl100k_base`")]
    UnknownEncoding(String),
    #[error("cannot load the built-in {name} encoding: {message}")]
    Encoding { name: &'static str, message: String },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a usable tokenizer.json: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error(
        "this tokentap was built without tokenizer.json support (rebuild with \
         `--features tokenizers`), or use `encoding: o200k_base` / `cl100k_base`"
    )]
    Unsupported,
}

impl Tokenizer {
    /// A tokenizer from any counter (tests, embedders).
    pub fn new(name: &str, counter: Arc<dyn TokenCounter>) -> Tokenizer {
        Tokenizer {
            name: Arc::from(name),
            counter,
        }
    }

    /// Load the tokenizer `source` names: parse a built-in encoding's ranks, or read and
    /// parse a `tokenizer.json`.
    pub fn load(source: &TokenizerSource) -> Result<Tokenizer, TokenizerError> {
        match source {
            TokenizerSource::Encoding(name) => Tokenizer::encoding(name),
            TokenizerSource::File(path) => Tokenizer::from_file(path),
        }
    }

    /// A built-in tiktoken encoding ([`ENCODINGS`]). The first call for an encoding
    /// parses its ranks (a fraction of a second); later calls share them.
    pub fn encoding(name: &str) -> Result<Tokenizer, TokenizerError> {
        static O200K: OnceLock<CoreBPE> = OnceLock::new();
        static CL100K: OnceLock<CoreBPE> = OnceLock::new();
        let (name, cell) = match name {
            "o200k_base" => ("o200k_base", &O200K),
            "cl100k_base" => ("cl100k_base", &CL100K),
            other => return Err(TokenizerError::UnknownEncoding(other.to_string())),
        };
        let bpe = match cell.get() {
            Some(bpe) => bpe,
            None => {
                let loaded = if name == "o200k_base" {
                    tiktoken_rs::o200k_base()
                } else {
                    tiktoken_rs::cl100k_base()
                };
                let loaded = loaded.map_err(|err| TokenizerError::Encoding {
                    name,
                    message: err.to_string(),
                })?;
                cell.get_or_init(|| loaded)
            }
        };
        Ok(Tokenizer::new(name, Arc::new(Tiktoken(bpe))))
    }

    /// A Hugging Face `tokenizer.json` file (builds with the `tokenizers` feature).
    pub fn from_file(path: &Path) -> Result<Tokenizer, TokenizerError> {
        let bytes = std::fs::read(path).map_err(|source| TokenizerError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        hf::load(path, &bytes)
    }

    /// The encoding's name, or the file's path.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Tokens in `text`.
    pub fn count(&self, text: &str) -> u64 {
        u64::try_from(self.counter.count(text)).unwrap_or(u64::MAX)
    }
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Tokenizer").field(&self.name).finish()
    }
}

/// A tiktoken encoding. Output text is counted as ordinary text: a model writing
/// `<|endoftext|>` as text wrote ordinary tokens.
struct Tiktoken(&'static CoreBPE);

impl TokenCounter for Tiktoken {
    fn count(&self, text: &str) -> usize {
        self.0.count_ordinary(text)
    }
}

/// Hugging Face `tokenizer.json` files, loaded with the `tokenizers` crate.
#[cfg(feature = "tokenizers")]
mod hf {
    use std::path::Path;
    use std::sync::Arc;

    use super::{TokenCounter, Tokenizer, TokenizerError};

    /// A Hugging Face tokenizer; its post-processor's special tokens are not added.
    struct HfTokenizer(tokenizers::Tokenizer);

    impl TokenCounter for HfTokenizer {
        fn count(&self, text: &str) -> usize {
            // An encoding error (none is known for plain text) counts as no tokens, so
            // the event falls back to the one-token estimate.
            self.0.encode_fast(text, false).map_or(0, |e| e.len())
        }
    }

    pub(super) fn load(path: &Path, bytes: &[u8]) -> Result<Tokenizer, TokenizerError> {
        let inner =
            tokenizers::Tokenizer::from_bytes(bytes).map_err(|err| TokenizerError::Parse {
                path: path.to_path_buf(),
                message: err.to_string(),
            })?;
        Ok(Tokenizer::new(
            &path.display().to_string(),
            Arc::new(HfTokenizer(inner)),
        ))
    }
}

/// Without the `tokenizers` feature a `tokenizer.json` is refused as unsupported.
#[cfg(not(feature = "tokenizers"))]
mod hf {
    use std::path::Path;

    use super::{Tokenizer, TokenizerError};

    pub(super) fn load(_path: &Path, _bytes: &[u8]) -> Result<Tokenizer, TokenizerError> {
        Err(TokenizerError::Unsupported)
    }
}

impl Tokenizer {
    /// The counter itself, for a per-response [`TokenStream`](super::token_stream) (which
    /// builds on this module, not the other way round).
    pub(super) fn counter(&self) -> Arc<dyn TokenCounter> {
        Arc::clone(&self.counter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_encodings_count_like_tiktoken() {
        let o200k = Tokenizer::encoding("o200k_base").expect("o200k");
        let cl100k = Tokenizer::encoding("cl100k_base").expect("cl100k");
        let text = "Hello! It's nice to meet you. How can I help you today?";
        assert_eq!(
            o200k.count(text),
            tiktoken_rs::o200k_base()
                .unwrap()
                .encode_ordinary(text)
                .len() as u64
        );
        assert_eq!(
            cl100k.count(text),
            tiktoken_rs::cl100k_base()
                .unwrap()
                .encode_ordinary(text)
                .len() as u64
        );
        // Special-token text in output is ordinary text.
        assert!(o200k.count("<|endoftext|>") > 1);
        assert_eq!(o200k.name(), "o200k_base");
        assert!(matches!(
            Tokenizer::encoding("p50k_base"),
            Err(TokenizerError::UnknownEncoding(_))
        ));
    }

    #[test]
    fn sources_name_what_load_reads() {
        assert_eq!(
            TokenizerSource::encoding("cl100k_base").expect("built in"),
            TokenizerSource::Encoding("cl100k_base")
        );
        assert!(matches!(
            TokenizerSource::encoding("p50k_base"),
            Err(TokenizerError::UnknownEncoding(name)) if name == "p50k_base"
        ));
        let loaded = Tokenizer::load(&TokenizerSource::Encoding("o200k_base")).expect("loads");
        assert_eq!(loaded.name(), "o200k_base");
        let missing = TokenizerSource::File(PathBuf::from("/nonexistent/tokenizer.json"));
        assert!(matches!(
            Tokenizer::load(&missing),
            Err(TokenizerError::Read { .. })
        ));
    }

    #[test]
    fn missing_file_is_a_read_error() {
        let err = Tokenizer::from_file(Path::new("/nonexistent/tokenizer.json"))
            .expect_err("no such file");
        assert!(matches!(err, TokenizerError::Read { .. }), "{err}");
    }
}
