//! Typed RPC messages over the [`wire`](crate::wire) codec: a type that is [`Wire`] knows how
//! to append itself to a [`Writer`] and read itself back from a [`Reader`], so a request or a
//! reply is declared once and both sides — the client that encodes it and the server that
//! decodes it — use the same declaration.
//!
//! - Integers are little-endian, [`NodeId`] is its `u16`, `Vec<T>` is a `u32` count then the
//!   elements (so `Vec<u8>` is the same bytes as [`Writer::bytes`]), and a `String` is its
//!   UTF-8 bytes so (a server's message: decoding refuses bytes that are not UTF-8).
//! - [`wire_message!`](crate::wire_message) declares a struct (its fields in order) or an
//!   enum whose first byte is the variant's tag (then the variant's fields in order); an
//!   unknown tag is a [`WireError`] naming what was expected.
//! - [`Wire::from_bytes`] decodes a whole message and refuses trailing bytes; [`Wire::get`]
//!   reads one value and leaves the rest (a reply's body after its head).
//!
//! ```
//! use dmkit_verbs::wire::{Reader, Wire, Writer};
//!
//! dmkit_verbs::wire_message! {
//!     /// A request of a little key-value service.
//!     #[derive(Debug, PartialEq)]
//!     pub enum Request: "request kind" {
//!         Get = 1 { key: u64 },
//!         Put = 2 { key: u64, value: Vec<u8> },
//!         Stat = 3,
//!     }
//! }
//! dmkit_verbs::wire_message! {
//!     /// Every reply starts with this.
//!     #[derive(Debug, PartialEq)]
//!     pub struct Head { pub status: u8, pub load: u32 }
//! }
//!
//! let put = Request::Put { key: 7, value: b"seven".to_vec() };
//! let bytes = put.to_bytes();
//! assert_eq!(bytes[0], 2); // the tag, then the fields in order
//! assert_eq!(Request::from_bytes(&bytes)?, put);
//! assert_eq!(Request::from_bytes(&[3])?, Request::Stat);
//! assert_eq!(Request::from_bytes(&[9]).unwrap_err().0, "request kind");
//! // A reply: the head, then a body the caller reads according to the request.
//! let reply = Head { status: 0, load: 5 }.put(Writer::new()).u64(42).finish();
//! let mut r = Reader::new(&reply);
//! assert_eq!(r.get::<Head>()?, Head { status: 0, load: 5 });
//! assert_eq!(r.get::<u64>()?, 42);
//! # Ok::<(), dmkit_verbs::wire::WireError>(())
//! ```

use crate::types::NodeId;
use crate::wire::{Reader, WireError, Writer};

/// A value with a wire format: how it appends itself to a [`Writer`] and reads itself back
/// from a [`Reader`]. Declare messages with [`wire_message!`](crate::wire_message).
pub trait Wire: Sized {
    /// Appends the value to `w`.
    fn put(&self, w: Writer) -> Writer;

    /// Reads one value.
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError>;

    /// The value alone, as a message.
    fn to_bytes(&self) -> Vec<u8> {
        self.put(Writer::new()).finish()
    }

    /// A message that is exactly one value (trailing bytes are refused).
    fn from_bytes(b: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(b);
        let v = Self::get(&mut r)?;
        r.finish()?;
        Ok(v)
    }
}

macro_rules! integers {
    ($($t:ident),*) => {$(
        impl Wire for $t {
            fn put(&self, w: Writer) -> Writer {
                w.$t(*self)
            }
            fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
                r.$t()
            }
        }
    )*};
}
integers!(u8, u16, u32, u64);

impl Wire for NodeId {
    fn put(&self, w: Writer) -> Writer {
        w.u16(self.0)
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        r.u16().map(NodeId)
    }
}

impl Wire for String {
    fn put(&self, w: Writer) -> Writer {
        w.bytes(self.as_bytes())
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let b = r.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| WireError("utf-8"))
    }
}

impl<T: Wire> Wire for Vec<T> {
    fn put(&self, w: Writer) -> Writer {
        let count = u32::try_from(self.len()).expect("at most u32::MAX elements");
        self.iter().fold(w.u32(count), |w, v| v.put(w))
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let n = r.u32()? as usize;
        // A count from the network: never reserve more than the bytes that are there.
        let mut v = Vec::with_capacity(n.min(r.remaining()));
        for _ in 0..n {
            v.push(T::get(r)?);
        }
        Ok(v)
    }
}

/// Declares a struct or an enum and its [`Wire`](crate::wire::Wire) format: a struct is its fields in order; an enum is its variant's tag (a `u8`
/// literal), then that variant's fields in order. The enum names what it is after a colon
/// (`enum Request: "request kind"`): an unknown tag is `WireError("request kind")`.
/// Attributes (docs, derives) are kept.
#[macro_export]
macro_rules! wire_message {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $fvis:vis $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name { $( $(#[$fmeta])* $fvis $field: $ty, )* }

        impl $crate::wire::Wire for $name {
            fn put(&self, w: $crate::wire::Writer) -> $crate::wire::Writer {
                $( let w = $crate::wire::Wire::put(&self.$field, w); )*
                w
            }
            fn get(
                r: &mut $crate::wire::Reader<'_>,
            ) -> ::core::result::Result<Self, $crate::wire::WireError> {
                ::core::result::Result::Ok(Self { $( $field: $crate::wire::Wire::get(r)?, )* })
            }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident : $what:literal {
            $(
                $(#[$vmeta:meta])*
                $var:ident = $tag:literal $({ $( $field:ident : $ty:ty ),* $(,)? })?
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $name { $( $(#[$vmeta])* $var $({ $( $field: $ty, )* })?, )* }

        impl $crate::wire::Wire for $name {
            fn put(&self, w: $crate::wire::Writer) -> $crate::wire::Writer {
                match self {
                    $( $name::$var { $($( $field, )*)? } => {
                        let w = w.u8($tag);
                        $($( let w = $crate::wire::Wire::put($field, w); )*)?
                        w
                    } )*
                }
            }
            fn get(
                r: &mut $crate::wire::Reader<'_>,
            ) -> ::core::result::Result<Self, $crate::wire::WireError> {
                match r.u8()? {
                    $( $tag => ::core::result::Result::Ok(
                        $name::$var { $($( $field: $crate::wire::Wire::get(r)?, )*)? }
                    ), )*
                    _ => ::core::result::Result::Err($crate::wire::WireError($what)),
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::wire_message! {
        #[derive(Debug, Clone, PartialEq)]
        enum Shape: "shape" {
            Empty = 0,
            Point = 7 { node: NodeId, at: u64 },
            Many = 9 { parts: Vec<Part> },
        }
    }
    crate::wire_message! {
        #[derive(Debug, Clone, PartialEq)]
        struct Part { tag: u8, len: u16, off: u32 }
    }

    #[test]
    fn declared_messages_are_their_fields_in_order() {
        let p = Shape::Point {
            node: NodeId(3),
            at: 0x0102,
        };
        let b = p.to_bytes();
        assert_eq!(b, [7, 3, 0, 2, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Shape::from_bytes(&b), Ok(p));
        assert_eq!(Shape::Empty.to_bytes(), [0]);
        let many = Shape::Many {
            parts: vec![
                Part {
                    tag: 1,
                    len: 2,
                    off: 3,
                };
                2
            ],
        };
        let b = many.to_bytes();
        assert_eq!(b.len(), 1 + 4 + 2 * 7);
        assert_eq!(&b[..5], [9, 2, 0, 0, 0]);
        assert_eq!(Shape::from_bytes(&b), Ok(many));
        // Vec<u8> and String are length-prefixed byte strings.
        let v = vec![1u8, 2, 3];
        assert_eq!(v.to_bytes(), Writer::new().bytes(&[1, 2, 3]).finish());
        let s = "déjà".to_string();
        assert_eq!(s.to_bytes(), Writer::new().bytes(s.as_bytes()).finish());
        assert_eq!(String::from_bytes(&s.to_bytes()), Ok(s));
        let bad = Writer::new().bytes(&[0xff]).finish();
        assert_eq!(String::from_bytes(&bad), Err(WireError("utf-8")));
    }

    #[test]
    fn malformed_messages_are_errors() {
        assert_eq!(Shape::from_bytes(&[5]), Err(WireError("shape")));
        assert_eq!(Shape::from_bytes(&[7, 3]), Err(WireError("truncated")));
        assert_eq!(Shape::from_bytes(&[0, 0]), Err(WireError("trailing bytes")));
        // A count far beyond the bytes that follow fails without reserving for it.
        let lying = Writer::tagged(9).u32(u32::MAX).finish();
        assert_eq!(Shape::from_bytes(&lying), Err(WireError("truncated")));
        // get leaves the rest for the caller.
        let b = Writer::new().u8(0).u64(5).finish();
        let mut r = Reader::new(&b);
        assert_eq!(r.get::<Shape>(), Ok(Shape::Empty));
        assert_eq!(r.rest(), &5u64.to_le_bytes());
        assert!(r.finish().is_ok());
    }
}
