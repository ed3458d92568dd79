//! JSON objects only: [`Object`] reads a struct from a JSON object and
//! refuses every other form.
//!
//! serde's derived `Deserialize` for a struct also takes a JSON array, its
//! fields by position (`[["text", null]]` reads as `[{"data": "text",
//! "type": null}]`). No gapless shape is documented that way, so every body,
//! line or claim that is "a JSON object" is read through this wrapper: an
//! array (or any other value) is refused with serde's own message, `invalid
//! type: sequence, expected a JSON object`, and its line and column.

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use std::fmt;
use std::marker::PhantomData;

/// A `T` that was read from a JSON object (never from an array of its
/// fields by position).
///
/// ```
/// use gapless_protocol::object::Object;
/// #[derive(serde::Deserialize)]
/// struct Item { data: String }
/// let ok: Object<Item> = serde_json::from_str(r#"{"data": "x"}"#).unwrap();
/// assert_eq!(ok.0.data, "x");
/// let refused = serde_json::from_str::<Object<Item>>(r#"["x"]"#).err().unwrap();
/// assert!(refused.to_string().contains("expected a JSON object"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object<T>(pub T);

impl<T> Object<T> {
    /// The value read.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(MapOnly(PhantomData)).map(Object)
    }
}

/// Accepts a map and hands it to `T`; anything else is refused by serde's
/// default visitor methods ("invalid type: …, expected a JSON object").
struct MapOnly<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for MapOnly<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
    }
}

#[cfg(test)]
mod tests {
    use super::Object;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Item {
        data: String,
        #[serde(rename = "type")]
        event_type: Option<String>,
    }

    #[test]
    fn objects_read_as_the_struct_would() {
        let got: Vec<Object<Item>> =
            serde_json::from_str(r#"[{"data": "a"}, {"type": "t", "data": "b"}]"#).expect("ok");
        assert_eq!(
            got.into_iter().map(Object::into_inner).collect::<Vec<_>>(),
            [
                Item {
                    data: "a".into(),
                    event_type: None
                },
                Item {
                    data: "b".into(),
                    event_type: Some("t".into())
                }
            ]
        );
        let e = serde_json::from_str::<Object<Item>>(r#"{"data": "a", "x": 1}"#)
            .expect_err("unknown field");
        assert!(e.to_string().contains("unknown field `x`"), "{e}");
        let e = serde_json::from_str::<Object<Item>>(r#"{"type": "t"}"#).expect_err("no data");
        assert!(e.to_string().contains("missing field `data`"), "{e}");
    }

    #[test]
    fn every_other_form_is_refused() {
        // The array form is what serde's derive would have taken.
        assert!(serde_json::from_str::<Item>(r#"["x", null]"#).is_ok());
        for text in [
            r#"["x", null]"#,
            r#"["x"]"#,
            "[]",
            r#""x""#,
            "1",
            "null",
            "true",
        ] {
            let e = serde_json::from_str::<Object<Item>>(text).expect_err(text);
            assert!(
                e.to_string().contains("expected a JSON object"),
                "{text}: {e}"
            );
        }
        let e = serde_json::from_str::<Vec<Object<Item>>>(r#"[{"data": "a"}, ["b", null]]"#)
            .expect_err("second item");
        assert!(e.to_string().contains("line 1 column 16"), "{e}");
    }
}
