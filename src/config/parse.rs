//! YAML text to the raw shape, with serde's errors turned into located issues.
//!
//! serde stops at the first error. To report every one it can, the text is read again
//! with each top-level setting found wrong left out, until the rest reads: each setting
//! (`upstream`, `observe`, `routes`, ...) reports its first error, with the key path and
//! the line:column serde_yaml gives it. What is left out is then not validated (its
//! defaults would only add issues about keys the user did not write). A YAML syntax error
//! is the one issue: nothing after it can be trusted.

use std::cell::RefCell;
use std::fmt;

use serde::de::value::MapAccessDeserializer;
use serde::de::{
    self, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer, MapAccess, Visitor,
};
use serde::Deserialize;

use super::issue::ConfigIssue;
use super::raw::RawConfig;

/// The outcome of reading the text.
pub(super) struct Parsed {
    /// The settings that read, with the ones left out at their defaults; `None` when
    /// nothing could be read (a YAML syntax error, a document that is not a mapping).
    pub raw: Option<RawConfig>,
    /// Every error found, in the order of the settings in the file.
    pub issues: Vec<ConfigIssue>,
    /// The top-level keys left out because they hold an error.
    pub left_out: Vec<String>,
}

impl Parsed {
    /// Whether `path` lies in a setting that was left out.
    pub fn is_left_out(&self, path: &str) -> bool {
        self.left_out.iter().any(|key| {
            path.strip_prefix(key.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        })
    }
}

/// Read YAML into the raw shape, collecting one located issue per wrong setting.
pub(super) fn parse(text: &str) -> Parsed {
    let mut parsed = Parsed {
        raw: None,
        issues: Vec::new(),
        left_out: Vec::new(),
    };
    // An empty file means "all defaults".
    if text.trim().is_empty() {
        parsed.raw = Some(RawConfig::default());
        return parsed;
    }
    // serde_yaml parses as it goes: a syntax error late in the file would surface only
    // once the passes reach it, after type errors it caused. Read it all once first.
    let mut track = serde_path_to_error::Track::new();
    let whole = serde_path_to_error::Deserializer::new(
        serde_yaml::Deserializer::from_str(text),
        &mut track,
    );
    if let Err(err) = IgnoredAny::deserialize(whole) {
        parsed.issues.push(issue(track.path().to_string(), err));
        return parsed;
    }
    loop {
        let reading = RefCell::new(None);
        match read(text, &parsed.left_out, &reading) {
            Ok(raw) => {
                parsed.raw = Some(raw);
                return parsed;
            }
            Err(issue) => {
                parsed.issues.push(issue);
                // Each pass leaves out one more setting, so this ends.
                match reading.into_inner() {
                    Some(key) if !parsed.left_out.contains(&key) => parsed.left_out.push(key),
                    _ => return parsed,
                }
            }
        }
    }
}

/// One pass over the text, leaving out `left_out`; `reading` ends as the top-level key
/// being read when an error stopped the pass.
fn read(
    text: &str,
    left_out: &[String],
    reading: &RefCell<Option<String>>,
) -> Result<RawConfig, ConfigIssue> {
    let mut track = serde_path_to_error::Track::new();
    let deserializer = serde_path_to_error::Deserializer::new(
        serde_yaml::Deserializer::from_str(text),
        &mut track,
    );
    deserializer
        .deserialize_map(Document { left_out, reading })
        .map_err(|err| issue(track.path().to_string(), err))
}

/// serde_yaml's error as an issue at `path`.
fn issue(path: String, err: serde_yaml::Error) -> ConfigIssue {
    let location = err.location().map(|l| (l.line(), l.column()));
    // serde_yaml prefixes some messages with the path and position again; keep the
    // message itself.
    let mut message = err.to_string();
    if let Some(cut) = message.find(" at line ") {
        message.truncate(cut);
    }
    // ... and sometimes with the path (or its parent) as a prefix.
    if let Some((prefix, rest)) = message.split_once(": ") {
        if path.starts_with(prefix) {
            message = rest.to_string();
        }
    }
    ConfigIssue {
        path,
        location,
        message,
    }
}

/// The whole document: a mapping read as [`RawConfig`] without the left-out keys.
struct Document<'a> {
    left_out: &'a [String],
    reading: &'a RefCell<Option<String>>,
}

impl<'de> Visitor<'de> for Document<'_> {
    type Value = RawConfig;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping of settings such as `upstream` and `listen`")
    }

    fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<RawConfig, M::Error> {
        RawConfig::deserialize(MapAccessDeserializer::new(LeavingOut {
            map,
            left_out: self.left_out,
            reading: self.reading,
        }))
    }
}

/// The document's entries without the left-out keys, noting which key is being read.
struct LeavingOut<'a, M> {
    map: M,
    left_out: &'a [String],
    reading: &'a RefCell<Option<String>>,
}

impl<'de, M: MapAccess<'de>> MapAccess<'de> for LeavingOut<'_, M> {
    type Error = M::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, M::Error> {
        let mut seed = Some(seed);
        loop {
            let key = self.map.next_key_seed(Key {
                seed: &mut seed,
                left_out: self.left_out,
                reading: self.reading,
            })?;
            match key {
                Some(Some(key)) => return Ok(Some(key)),
                Some(None) => {
                    self.map.next_value::<IgnoredAny>()?;
                }
                None => {
                    *self.reading.borrow_mut() = None;
                    return Ok(None);
                }
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, M::Error> {
        self.map.next_value_seed(seed)
    }
}

/// One top-level key: `None` when it is left out, else what `seed` makes of it. It is
/// read inside serde_yaml's own key, so an unknown key is located where it is written.
struct Key<'s, 'a, K> {
    seed: &'s mut Option<K>,
    left_out: &'a [String],
    reading: &'a RefCell<Option<String>>,
}

impl<'de, K: DeserializeSeed<'de>> DeserializeSeed<'de> for Key<'_, '_, K> {
    type Value = Option<K::Value>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, K: DeserializeSeed<'de>> Visitor<'de> for Key<'_, '_, K> {
    type Value = Option<K::Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the name of a setting")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        *self.reading.borrow_mut() = Some(key.to_string());
        if self.left_out.iter().any(|left| left == key) {
            return Ok(None);
        }
        let seed = self
            .seed
            .take()
            .ok_or_else(|| E::custom("a key was read twice"))?;
        seed.deserialize(key.into_deserializer()).map(Some)
    }
}
