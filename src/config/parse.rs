//! YAML text to the raw shape, with serde's error turned into a located issue.

use super::raw::RawConfig;
use super::ConfigIssue;

/// Parse YAML into the raw shape; a failure is one located issue.
pub fn parse(text: &str) -> Result<RawConfig, ConfigIssue> {
    // An empty file means "all defaults".
    if text.trim().is_empty() {
        return Ok(RawConfig::default());
    }
    let deserializer = serde_yaml::Deserializer::from_str(text);
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let location = inner.location().map(|l| (l.line(), l.column()));
        // serde_yaml prefixes some messages with the path and position again; keep the
        // message itself.
        let mut message = inner.to_string();
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
    })
}
