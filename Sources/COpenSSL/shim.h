// OpenSSL 3.0 (libcrypto) as Debian 12 ships it: `apt-get install libssl-dev pkg-config`.
// Swift code reaches it only through IAPAuthentication's one wrapper type (OpenSSLCertificate
// and friends in OpenSSL.swift). The inline functions below stand in for macros and variadic
// functions Swift cannot import; they add no logic of their own.
#pragma once
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/objects.h>
#include <openssl/pem.h>
#include <openssl/pkcs7.h>
#include <openssl/rsa.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

/// The certificates of a PKCS#7 SignedData (NULL for any other content type or none).
static inline STACK_OF(X509) *accessoryhost_pkcs7_certificates(PKCS7 *p7) {
    if (p7 == NULL || p7->type == NULL || !PKCS7_type_is_signed(p7) || p7->d.sign == NULL) return NULL;
    return p7->d.sign->cert;
}

static inline int accessoryhost_sk_X509_num(const STACK_OF(X509) *stack) { return sk_X509_num(stack); }
static inline X509 *accessoryhost_sk_X509_value(const STACK_OF(X509) *stack, int index) { return sk_X509_value(stack, index); }
static inline STACK_OF(X509) *accessoryhost_sk_X509_new_null(void) { return sk_X509_new_null(); }
/// Pushes without taking a reference: the caller keeps `x509` alive for as long as the stack.
static inline int accessoryhost_sk_X509_push(STACK_OF(X509) *stack, X509 *x509) { return sk_X509_push(stack, x509); }
/// Frees the stack only, not the certificates.
static inline void accessoryhost_sk_X509_free(STACK_OF(X509) *stack) { sk_X509_free(stack); }

/// EVP_RSA_gen and EVP_EC_gen are macros over the variadic EVP_PKEY_Q_keygen.
static inline EVP_PKEY *accessoryhost_rsa_generate(unsigned int bits) { return EVP_RSA_gen(bits); }
static inline EVP_PKEY *accessoryhost_ec_generate(const char *curve) { return EVP_EC_gen(curve); }

/// Flags for X509_NAME_print_ex: `C=US, O=Apple Inc., CN=…` in the certificate's order, UTF-8
/// kept (control characters escaped as RFC 2253 does).
static inline unsigned long accessoryhost_name_flags(void) {
    return (ASN1_STRFLGS_RFC2253 & ~(unsigned long)ASN1_STRFLGS_ESC_MSB) | XN_FLAG_SEP_CPLUS_SPC | XN_FLAG_FN_SN;
}
