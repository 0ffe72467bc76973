/*
 * auth.h - the cryptography of the TCP transport (tcp.c) and its address policy. Every primitive
 * is OpenSSL's libcrypto: HMAC-SHA-256 through EVP_MAC, nonces from RAND_bytes (the OS's CSPRNG
 * behind OpenSSL's DRBG), MAC comparison with CRYPTO_memcmp (constant time), secrets wiped with
 * OPENSSL_cleanse. This file only wraps them in rlx_status; it implements no hash or cipher of its
 * own. Also the loopback test behind "no token: loopback peers only" (tests call it directly).
 *
 * Never prints, never exits; an OpenSSL failure is RLX_ERR_INTERNAL with libcrypto's reason, and
 * OpenSSL's thread-local error queue is left empty.
 */
#ifndef RLX_DIST_AUTH_H
#define RLX_DIST_AUTH_H

#include <stddef.h>
#include <sys/socket.h>

#include "rlx/rlx.h"

#define RLX_HMAC_BYTES 32 /* HMAC-SHA-256 */

/* One HMAC-SHA-256 computation at a time (begin, update..., end; then begin again with any key).
 * Used by one thread at a time. */
struct rlx_hmac;
rlx_status rlx_hmac_create(struct rlx_hmac **out);
void rlx_hmac_free(struct rlx_hmac *h);                                         /* NULL is a no-op */
rlx_status rlx_hmac_begin(struct rlx_hmac *h, const void *key, size_t key_len); /* key_len > 0 */
rlx_status rlx_hmac_update(struct rlx_hmac *h, const void *data, size_t n);
rlx_status rlx_hmac_end(struct rlx_hmac *h, unsigned char out[RLX_HMAC_BYTES]);

/* n bytes from a cryptographically secure generator. */
rlx_status rlx_crypto_random(void *out, size_t n);

/* 1 when the n bytes of a and b are equal; the time taken does not depend on where they differ. */
int rlx_crypto_equal(const void *a, const void *b, size_t n);

/* Overwrites n bytes in a way the compiler cannot drop. */
void rlx_crypto_wipe(void *p, size_t n);

/* 1 for a loopback address: IPv4 127.0.0.0/8, IPv6 ::1, IPv4-mapped ::ffff:127.0.0.0/104. 0 for
 * anything else (other families, a length too short for the family). */
int rlx_sockaddr_is_loopback(const struct sockaddr *sa, socklen_t len);

#endif
