/*
 * auth.c - see auth.h: thin rlx_status wrappers over libcrypto (EVP_MAC "HMAC" with SHA-256,
 * RAND_bytes, CRYPTO_memcmp, OPENSSL_cleanse) and the loopback test. Must never grow a primitive
 * of its own: anything cryptographic is a call into OpenSSL.
 */
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include "core/core.h"
#include "distributed/auth.h"

struct rlx_hmac {
    EVP_MAC_CTX *ctx; /* HMAC with its digest set to SHA-256; keyed by each begin */
};

/* RLX_ERR_INTERNAL naming the failed call and libcrypto's first queued reason; empties the queue. */
static rlx_status crypto_error(const char *what)
{
    char reason[256] = "no reason given";
    unsigned long e = ERR_get_error();
    if (e != 0) ERR_error_string_n(e, reason, sizeof reason);
    ERR_clear_error();
    return rlx_set_error(RLX_ERR_INTERNAL, "libcrypto: %s failed: %s", what, reason);
}

rlx_status rlx_hmac_create(struct rlx_hmac **out)
{
    struct rlx_hmac *h = rlx_calloc(1, sizeof *h);
    if (h == NULL) return RLX_ERR_NOMEM;
    EVP_MAC *mac = EVP_MAC_fetch(NULL, OSSL_MAC_NAME_HMAC, NULL);
    if (mac == NULL) {
        rlx_hmac_free(h);
        return crypto_error("EVP_MAC_fetch(HMAC)");
    }
    h->ctx = EVP_MAC_CTX_new(mac);
    EVP_MAC_free(mac); /* the context holds its own reference */
    if (h->ctx == NULL) {
        rlx_hmac_free(h);
        return crypto_error("EVP_MAC_CTX_new");
    }
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_end(),
    };
    if (!EVP_MAC_CTX_set_params(h->ctx, params)) {
        rlx_hmac_free(h);
        return crypto_error("EVP_MAC_CTX_set_params(digest SHA256)");
    }
    *out = h;
    return RLX_OK;
}

void rlx_hmac_free(struct rlx_hmac *h)
{
    if (h == NULL) return;
    EVP_MAC_CTX_free(h->ctx);
    free(h);
}

rlx_status rlx_hmac_begin(struct rlx_hmac *h, const void *key, size_t key_len)
{
    if (key == NULL || key_len == 0) return rlx_set_error(RLX_ERR_INVALID, "HMAC: empty key");
    if (!EVP_MAC_init(h->ctx, key, key_len, NULL)) return crypto_error("EVP_MAC_init");
    return RLX_OK;
}

rlx_status rlx_hmac_update(struct rlx_hmac *h, const void *data, size_t n)
{
    if (n > 0 && !EVP_MAC_update(h->ctx, data, n)) return crypto_error("EVP_MAC_update");
    return RLX_OK;
}

rlx_status rlx_hmac_end(struct rlx_hmac *h, unsigned char out[RLX_HMAC_BYTES])
{
    size_t n = 0;
    if (!EVP_MAC_final(h->ctx, out, &n, RLX_HMAC_BYTES)) return crypto_error("EVP_MAC_final");
    if (n != RLX_HMAC_BYTES)
        return rlx_set_error(RLX_ERR_INTERNAL, "libcrypto: HMAC-SHA-256 gave %zu bytes, expected %d", n,
                             RLX_HMAC_BYTES);
    return RLX_OK;
}

rlx_status rlx_crypto_random(void *out, size_t n)
{
    if (n > 0x7fffffff || RAND_bytes(out, (int)n) != 1) return crypto_error("RAND_bytes");
    return RLX_OK;
}

int rlx_crypto_equal(const void *a, const void *b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

void rlx_crypto_wipe(void *p, size_t n)
{
    if (p != NULL && n > 0) OPENSSL_cleanse(p, n);
}

int rlx_sockaddr_is_loopback(const struct sockaddr *sa, socklen_t len)
{
    if (sa == NULL) return 0;
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in in;
        memcpy(&in, sa, sizeof in);
        return (ntohl(in.sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 in6;
        memcpy(&in6, sa, sizeof in6);
        if (IN6_IS_ADDR_LOOPBACK(&in6.sin6_addr)) return 1;
        return IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr) && in6.sin6_addr.s6_addr[12] == 127;
    }
    return 0;
}
