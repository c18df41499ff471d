//! 64-bit integers in JSON that every client reads exactly.
//!
//! Epochs start at the clock floor (`ms × 2^20`, about 2^61 today, [`crate::clock`]): far
//! above 2^53, the largest integer a JavaScript number or `jq` holds exactly. Written as JSON
//! numbers they would be rounded — two different epochs shown as equal, a refused write
//! whose epoch looks like its fence. So the HTTP APIs, `--json` output and the console's data
//! write every epoch, fence and counter as a **decimal string**, as the proto3 JSON mapping
//! does for `uint64`; readers here accept a string or a number (an older peer's answer).
//!
//! The backup file's body and `restore.json`, which an operator may read with `jq`, write
//! strings too; the lease log and the Raft log keep numbers: only Rust reads them.
//!
//! Use with `#[serde(with = "palisade_core::json::string")]` (a `u64` or an [`crate::Epoch`]),
//! `…::json::option_string` (an `Option` of one) or `…::json::string_map` (a map to them).

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::Serializer;

/// A value that is a u64 underneath (a `u64`, an [`crate::Epoch`]).
pub trait U64Like: Copy {
    /// The integer.
    fn to_u64(self) -> u64;
    /// From the integer.
    fn from_u64(value: u64) -> Self;
}

impl U64Like for u64 {
    fn to_u64(self) -> u64 {
        self
    }
    fn from_u64(value: u64) -> Self {
        value
    }
}

impl U64Like for crate::Epoch {
    fn to_u64(self) -> u64 {
        self.0
    }
    fn from_u64(value: u64) -> Self {
        crate::Epoch(value)
    }
}

/// The JSON value of `value`: its decimal string (for `json!` literals).
pub fn value(value: impl U64Like) -> serde_json::Value {
    serde_json::Value::String(value.to_u64().to_string())
}

/// Reads a u64 written either way (a decimal string or a JSON number) from a JSON value.
pub fn read(value: &serde_json::Value) -> Option<u64> {
    match value {
        serde_json::Value::String(text) => text.parse().ok(),
        other => other.as_u64(),
    }
}

struct U64Visitor;

impl Visitor<'_> for U64Visitor {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an unsigned 64-bit integer, as a decimal string or a number")
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<u64, E> {
        Ok(value)
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<u64, E> {
        u64::try_from(value).map_err(|_| E::custom("a negative number is not an epoch"))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<u64, E> {
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(E::custom(format!("{text:?} is not a decimal u64")));
        }
        text.parse()
            .map_err(|_| E::custom(format!("{text:?} does not fit in a u64")))
    }
}

/// A u64 as a decimal string.
pub mod string {
    use super::*;

    /// Writes the decimal string.
    pub fn serialize<T: U64Like, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&value.to_u64())
    }

    /// Reads a decimal string or a number.
    pub fn deserialize<'de, T: U64Like, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        d.deserialize_any(U64Visitor).map(T::from_u64)
    }
}

/// An optional u64 as a decimal string or `null`.
pub mod option_string {
    use super::*;
    use serde::Deserialize;

    /// Writes the decimal string or `null`.
    pub fn serialize<T: U64Like, S: Serializer>(
        value: &Option<T>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => s.collect_str(&value.to_u64()),
            None => s.serialize_none(),
        }
    }

    /// Reads a decimal string, a number or `null`.
    pub fn deserialize<'de, T: U64Like, D: Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(with = "super::string")] u64);
        Ok(Option::<Wrapped>::deserialize(d)?.map(|w| T::from_u64(w.0)))
    }
}

/// A map whose values are u64s written as decimal strings.
pub mod string_map {
    use std::collections::BTreeMap;

    use super::*;
    use serde::ser::SerializeMap;
    use serde::Deserialize;

    /// Writes each value as a decimal string.
    pub fn serialize<S: Serializer>(map: &BTreeMap<String, u64>, s: S) -> Result<S::Ok, S::Error> {
        let mut out = s.serialize_map(Some(map.len()))?;
        for (key, value) in map {
            out.serialize_entry(key, &value.to_string())?;
        }
        out.end()
    }

    /// Reads values written as decimal strings or numbers.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, u64>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(with = "super::string")] u64);
        Ok(BTreeMap::<String, Wrapped>::deserialize(d)?
            .into_iter()
            .map(|(key, value)| (key, value.0))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use crate::Epoch;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Answer {
        #[serde(with = "super::string")]
        epoch: Epoch,
        #[serde(with = "super::option_string")]
        fence: Option<u64>,
    }

    #[test]
    fn epochs_above_2_pow_53_travel_exactly() {
        // Two epochs a JavaScript number cannot tell apart.
        let (a, b) = (1_887_436_800_000_508_163_u64, 1_887_436_800_000_508_164_u64);
        assert_eq!(a as f64, b as f64);
        let text = serde_json::to_string(&Answer {
            epoch: Epoch(a),
            fence: Some(b),
        })
        .unwrap();
        assert_eq!(
            text,
            r#"{"epoch":"1887436800000508163","fence":"1887436800000508164"}"#
        );
        let back: Answer = serde_json::from_str(&text).unwrap();
        assert_eq!((back.epoch, back.fence), (Epoch(a), Some(b)));
        // An older peer's numbers and nulls are read too.
        let old: Answer = serde_json::from_str(r#"{"epoch":7,"fence":null}"#).unwrap();
        assert_eq!((old.epoch, old.fence), (Epoch(7), None));
        assert_eq!(super::read(&super::value(a)), Some(a));
        assert_eq!(super::read(&serde_json::json!(5)), Some(5));
    }

    #[test]
    fn what_is_not_a_u64_is_refused() {
        for bad in [
            r#"{"epoch":"-1","fence":null}"#,
            r#"{"epoch":"1e3","fence":null}"#,
            r#"{"epoch":"18446744073709551616","fence":null}"#,
            r#"{"epoch":"","fence":null}"#,
            r#"{"epoch":-4,"fence":null}"#,
        ] {
            assert!(serde_json::from_str::<Answer>(bad).is_err(), "{bad}");
        }
    }
}
