//! Challenge-response admission with a cluster secret: each side proves it knows the secret by
//! an HMAC-SHA256 over the other side's fresh nonce. The secret never crosses the wire.

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

pub const NONCE_LEN: usize = 32;
pub const MAC_LEN: usize = 32;

pub fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut n);
    n
}

fn mac(secret: &[u8], role: &[u8], nonce: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(b"dmkit-tcp-auth-v1/");
    m.update(role);
    m.update(nonce);
    m
}

/// The proof `role` ("client" or "server") gives for the peer's `nonce`.
pub fn prove(secret: &[u8], role: &[u8], nonce: &[u8]) -> [u8; MAC_LEN] {
    mac(secret, role, nonce).finalize().into_bytes().into()
}

/// Checks a proof in constant time.
pub fn verify(secret: &[u8], role: &[u8], nonce: &[u8], proof: &[u8]) -> bool {
    mac(secret, role, nonce).verify_slice(proof).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_depend_on_secret_role_and_nonce() {
        let n = nonce();
        let p = prove(b"s3cret", b"client", &n);
        assert!(verify(b"s3cret", b"client", &n, &p));
        assert!(!verify(b"other", b"client", &n, &p));
        assert!(!verify(b"s3cret", b"server", &n, &p));
        assert!(!verify(b"s3cret", b"client", &nonce(), &p));
    }
}
