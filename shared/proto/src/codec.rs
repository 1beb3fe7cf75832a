//! The protobuf codec every generated Antler client and server uses: tonic's prost codec with a
//! smaller starting buffer.
//!
//! tonic gives every call an 8 KiB encode buffer and an 8 KiB decode buffer that live as long as the
//! call. Most Antler messages are a few hundred bytes (events, token deltas, unary replies), and a
//! lead run waiting on its model holds one streaming call open on each side of the in-process hop
//! for as long as the model takes: three such buffers, 24 KiB per waiting run, was the largest item
//! in its resident memory (issue #11). Buffers grow on demand, so a large message costs a few
//! reallocations instead.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Starting size of a call's encode and decode buffers.
pub const BUFFER_BYTES: usize = 1024;
/// tonic's default: an encoder yields after this many bytes of a stream's messages.
pub const YIELD_THRESHOLD_BYTES: usize = 32 * 1024;

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD_BYTES)
}

/// See the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}
