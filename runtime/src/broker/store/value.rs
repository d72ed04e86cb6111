//! The values that cross the store's SQL boundary, the same for SQLite and PostgreSQL.
//!
//! Store functions bind parameters with [`params!`](crate::params) (anything [`ToValue`]) and read
//! columns from a [`Row`] with [`Row::get`] (anything [`FromValue`]). Four kinds cover every
//! column the broker has: 64-bit integers (times in ms, counts, sequences, flags as 0/1), text
//! (names, ids, JSON kept as the bytes it is served as), bytes, and NULL. On PostgreSQL every
//! integer column is `BIGINT`, so an integer binds and reads the same on both.

use super::super::db::StoreError;

/// One SQL value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// NULL.
    Null,
    /// A 64-bit integer.
    Int(i64),
    /// Text.
    Text(String),
    /// Bytes.
    Blob(Vec<u8>),
}

/// Something that binds as a [`Value`].
pub trait ToValue {
    /// The value to bind.
    fn to_value(&self) -> Value;
}

impl<T: ToValue + ?Sized> ToValue for &T {
    fn to_value(&self) -> Value {
        (**self).to_value()
    }
}

impl ToValue for i64 {
    fn to_value(&self) -> Value {
        Value::Int(*self)
    }
}

macro_rules! small_ints {
    ($($t:ty),*) => {$(
        impl ToValue for $t {
            fn to_value(&self) -> Value {
                Value::Int(i64::from(*self))
            }
        }
    )*};
}
small_ints!(i32, u32, u16, u8, bool);

/// Values past `i64::MAX` bind as `i64::MAX` (no stored count or time comes near it).
impl ToValue for u64 {
    fn to_value(&self) -> Value {
        Value::Int(i64::try_from(*self).unwrap_or(i64::MAX))
    }
}

/// Values past `i64::MAX` bind as `i64::MAX`.
impl ToValue for usize {
    fn to_value(&self) -> Value {
        Value::Int(i64::try_from(*self).unwrap_or(i64::MAX))
    }
}

impl ToValue for str {
    fn to_value(&self) -> Value {
        Value::Text(self.to_owned())
    }
}

impl ToValue for String {
    fn to_value(&self) -> Value {
        Value::Text(self.clone())
    }
}

impl ToValue for [u8] {
    fn to_value(&self) -> Value {
        Value::Blob(self.to_vec())
    }
}

impl ToValue for Vec<u8> {
    fn to_value(&self) -> Value {
        Value::Blob(self.clone())
    }
}

impl<T: ToValue> ToValue for Option<T> {
    fn to_value(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToValue::to_value)
    }
}

impl ToValue for Value {
    fn to_value(&self) -> Value {
        self.clone()
    }
}

/// Something a column reads as.
pub trait FromValue: Sized {
    /// Converts `v`, or says why it cannot.
    fn from_value(v: &Value) -> Result<Self, String>;
}

impl FromValue for i64 {
    fn from_value(v: &Value) -> Result<Self, String> {
        match v {
            Value::Int(i) => Ok(*i),
            other => Err(format!("expected an integer, found {}", kind(other))),
        }
    }
}

macro_rules! narrow_ints {
    ($($t:ty),*) => {$(
        impl FromValue for $t {
            fn from_value(v: &Value) -> Result<Self, String> {
                let i = i64::from_value(v)?;
                <$t>::try_from(i).map_err(|_| format!("{i} does not fit {}", stringify!($t)))
            }
        }
    )*};
}
narrow_ints!(i32, u32, u64, usize, u16, u8);

impl FromValue for bool {
    fn from_value(v: &Value) -> Result<Self, String> {
        Ok(i64::from_value(v)? != 0)
    }
}

impl FromValue for String {
    fn from_value(v: &Value) -> Result<Self, String> {
        match v {
            Value::Text(s) => Ok(s.clone()),
            other => Err(format!("expected text, found {}", kind(other))),
        }
    }
}

impl FromValue for Vec<u8> {
    fn from_value(v: &Value) -> Result<Self, String> {
        match v {
            Value::Blob(b) => Ok(b.clone()),
            // SQLite hands back what was stored; text bound as bytes reads back as text.
            Value::Text(s) => Ok(s.as_bytes().to_vec()),
            other => Err(format!("expected bytes, found {}", kind(other))),
        }
    }
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(v: &Value) -> Result<Self, String> {
        match v {
            Value::Null => Ok(None),
            other => T::from_value(other).map(Some),
        }
    }
}

impl FromValue for Value {
    fn from_value(v: &Value) -> Result<Self, String> {
        Ok(v.clone())
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "NULL",
        Value::Int(_) => "an integer",
        Value::Text(_) => "text",
        Value::Blob(_) => "bytes",
    }
}

/// One result row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    values: Vec<Value>,
}

impl Row {
    /// A row of `values`, in column order.
    pub fn new(values: Vec<Value>) -> Row {
        Row { values }
    }

    /// Column `i` (from 0) as `T`.
    pub fn get<T: FromValue>(&self, i: usize) -> Result<T, StoreError> {
        let v = self
            .values
            .get(i)
            .ok_or_else(|| StoreError::Corrupt(format!("no column {i} in a row")))?;
        T::from_value(v).map_err(|e| StoreError::Corrupt(format!("column {i}: {e}")))
    }

    /// How many columns the row has.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the row has no columns.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// Binds a list of parameters: `conn.execute(sql, params![a, b, c])`.
#[macro_export]
macro_rules! params {
    () => {
        &[] as &[&dyn $crate::broker::store::value::ToValue]
    };
    ($($x:expr),+ $(,)?) => {
        &[$(&$x as &dyn $crate::broker::store::value::ToValue),+] as &[&dyn $crate::broker::store::value::ToValue]
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_convert_both_ways_and_refuse_what_does_not_fit() {
        assert_eq!(5u64.to_value(), Value::Int(5));
        assert_eq!(u64::MAX.to_value(), Value::Int(i64::MAX));
        assert_eq!(true.to_value(), Value::Int(1));
        assert_eq!(u32::from_value(&Value::Int(7)), Ok(7));
        assert!(u32::from_value(&Value::Int(-1)).is_err());
        assert!(i64::from_value(&Value::Text("7".into())).is_err());
        assert_eq!(bool::from_value(&Value::Int(0)), Ok(false));
    }

    #[test]
    fn options_read_null_as_none() {
        assert_eq!(Option::<i64>::from_value(&Value::Null), Ok(None));
        assert_eq!(Option::<String>::None.to_value(), Value::Null);
        assert_eq!(
            Option::<String>::from_value(&Value::Text("a".into())),
            Ok(Some("a".into()))
        );
        assert!(String::from_value(&Value::Null).is_err());
    }

    #[test]
    fn a_row_names_the_column_it_cannot_read() {
        let row = Row::new(vec![Value::Int(1), Value::Null]);
        assert_eq!(row.get::<i64>(0).ok(), Some(1));
        let e = row.get::<String>(1).expect_err("NULL is no text");
        assert_eq!(
            e.to_string(),
            "corrupt store: column 1: expected text, found NULL"
        );
        assert!(row.get::<i64>(2).is_err());
    }
}
