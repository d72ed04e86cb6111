//! Typed, lenient reading of a broker answer straight from its bytes.
//!
//! A tool's text reads the broker's JSON leniently: a field that is missing, `null` or of
//! another type reads as its empty value (`""`, `0`, no items), never as a failure. Reading
//! into a [`serde_json::Value`] first gives that for free but builds a map per object and a
//! `String` per string; a [`Shape`] reads the same leniency directly from the bytes, borrowing
//! every string without escapes, and skips what the text does not show. The input must still be
//! one whole JSON text: anything else is the same error as `Value` gives.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A value read leniently: each JSON kind it does not expect reads as [`Default`] (after its
/// contents are checked and skipped).
pub(super) trait Shape<'de>: Default + Sized {
    /// From a string.
    fn string(_s: Cow<'de, str>) -> Self {
        Self::default()
    }
    /// From a non-negative integer.
    fn unsigned(_n: u64) -> Self {
        Self::default()
    }
    /// From an array.
    fn seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Self::default())
    }
    /// From an object.
    fn map<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Self::default())
    }
}

/// Deserializes any JSON value as the [`Shape`] `T`.
pub(super) struct Lenient<T>(pub T);

impl<'de, T: Shape<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ShapeVisitor(PhantomData)).map(Lenient)
    }
}

/// Reads the `T` of a [`Lenient`] value.
pub(super) fn read<'de, T: Shape<'de>>(bytes: &'de [u8]) -> serde_json::Result<T> {
    serde_json::from_slice::<Lenient<T>>(bytes).map(|l| l.0)
}

/// The value of the current entry of an object, as the [`Shape`] `T`.
pub(super) fn value<'de, T: Shape<'de>, A: MapAccess<'de>>(map: &mut A) -> Result<T, A::Error> {
    map.next_value::<Lenient<T>>().map(|l| l.0)
}

/// Reads the entries of an object: `field` gets each key in turn and reads its value with
/// [`value`] or leaves it to be skipped (returning `false`). A repeated key's last value wins,
/// as with `Value`.
pub(super) fn entries<'de, A: MapAccess<'de>>(
    mut map: A,
    mut field: impl FnMut(&str, &mut A) -> Result<bool, A::Error>,
) -> Result<(), A::Error> {
    while let Some(Lenient(key)) = map.next_key::<Lenient<Cow<'de, str>>>()? {
        if !field(&key, &mut map)? {
            map.next_value::<IgnoredAny>()?;
        }
    }
    Ok(())
}

struct ShapeVisitor<T>(PhantomData<T>);

impl<'de, T: Shape<'de>> Visitor<'de> for ShapeVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_i64<E>(self, n: i64) -> Result<T, E> {
        Ok(u64::try_from(n).map_or_else(|_| T::default(), T::unsigned))
    }
    fn visit_u64<E>(self, n: u64) -> Result<T, E> {
        Ok(T::unsigned(n))
    }
    fn visit_f64<E>(self, _: f64) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<T, E> {
        Ok(T::string(Cow::Borrowed(s)))
    }
    fn visit_str<E>(self, s: &str) -> Result<T, E> {
        Ok(T::string(Cow::Owned(s.to_owned())))
    }
    fn visit_string<E>(self, s: String) -> Result<T, E> {
        Ok(T::string(Cow::Owned(s)))
    }
    fn visit_unit<E>(self) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_none<E>(self) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        Lenient::<T>::deserialize(d).map(|l| l.0)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        T::seq(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::map(map)
    }
}

impl<'de> Shape<'de> for Cow<'de, str> {
    fn string(s: Cow<'de, str>) -> Self {
        s
    }
}

impl Shape<'_> for u64 {
    fn unsigned(n: u64) -> Self {
        n
    }
}

impl<'de, T: Shape<'de>> Shape<'de> for Vec<T> {
    fn seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(Lenient(item)) = seq.next_element::<Lenient<T>>()? {
            items.push(item);
        }
        Ok(items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq)]
    struct Pair<'a> {
        name: Cow<'a, str>,
        n: u64,
        tags: Vec<Cow<'a, str>>,
    }

    impl<'de> Shape<'de> for Pair<'de> {
        fn map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
            let mut p = Pair::default();
            entries(map, |key, map| {
                match key {
                    "name" => p.name = value(map)?,
                    "n" => p.n = value(map)?,
                    "tags" => p.tags = value(map)?,
                    _ => return Ok(false),
                }
                Ok(true)
            })?;
            Ok(p)
        }
    }

    #[test]
    fn each_field_of_another_kind_reads_as_empty() {
        let p: Pair =
            read(br#"{"name": 7, "n": -3, "tags": "x", "other": {"deep": [1, {}]}}"#).unwrap();
        assert_eq!(p, Pair::default());
        let p: Pair =
            read(br#"{"name": null, "n": 2.5, "tags": [1, "a", null, {"b": 1}]}"#).unwrap();
        assert_eq!(
            p,
            Pair {
                tags: vec!["".into(), "a".into(), "".into(), "".into()],
                ..Pair::default()
            }
        );
        for whole in [&b"[1, 2]"[..], b"\"text\"", b"null", b"true", b"12"] {
            assert_eq!(read::<Pair>(whole).unwrap(), Pair::default());
        }
    }

    #[test]
    fn strings_borrow_unless_escaped_and_the_last_repeat_wins() {
        let p: Pair = read(br#"{"name": "a", "name": "b\"c", "n": 1, "n": 4}"#).unwrap();
        assert_eq!(p.name, "b\"c");
        assert!(matches!(p.name, Cow::Owned(_)));
        assert_eq!(p.n, 4);
        let p: Pair = read(br#"{"name": "plain"}"#).unwrap();
        assert!(matches!(p.name, Cow::Borrowed("plain")));
    }

    #[test]
    fn what_is_not_one_json_text_is_the_value_error() {
        for bad in [
            &b"{\"name\": "[..],
            b"{} x",
            b"",
            b"{\"n\": [1,}",
            b"{\"tags\": [\"\\q\"]}",
        ] {
            let ours = read::<Pair>(bad).unwrap_err().to_string();
            let value = serde_json::from_slice::<serde_json::Value>(bad)
                .unwrap_err()
                .to_string();
            assert_eq!(ours, value, "{}", String::from_utf8_lossy(bad));
        }
    }
}
