#include "common/revocation_lists.h"

#include <dirent.h>
#include <openssl/bn.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/input_limits.h"

namespace shardline::common {
namespace {

constexpr size_t kMaxListBytes = 16 << 20;
constexpr int kMaxLists = 4096;

struct FreeX509 {
  void operator()(X509* x) const { X509_free(x); }
};
struct FreeCrl {
  void operator()(X509_CRL* c) const { X509_CRL_free(c); }
};
struct FreeBio {
  void operator()(BIO* b) const { BIO_free(b); }
};
using X509Ptr = std::unique_ptr<X509, FreeX509>;
using CrlPtr = std::unique_ptr<X509_CRL, FreeCrl>;
using BioPtr = std::unique_ptr<BIO, FreeBio>;

BioPtr MemoryBio(const std::string& bytes) {
  return BioPtr(BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
}

std::string NameOf(const X509_NAME* name) {
  char buffer[256];
  X509_NAME_oneline(name, buffer, sizeof(buffer));
  return buffer;
}

// OpenSSL's hashed form: eight hex digits, ".r", a number.
bool Hashed(const std::string& file) {
  if (file.size() < 11 || file.compare(8, 2, ".r") != 0) return false;
  for (size_t i = 0; i < file.size(); ++i) {
    if (i == 8 || i == 9) continue;
    const unsigned char c = static_cast<unsigned char>(file[i]);
    if (i < 8 ? !std::isxdigit(c) || std::isupper(c) : !std::isdigit(c)) return false;
  }
  return true;
}

std::string HexOf(const ASN1_INTEGER* serial) {
  BIGNUM* number = ASN1_INTEGER_to_BN(serial, nullptr);
  if (number == nullptr) return "?";
  char* hex = BN_bn2hex(number);
  std::string out = hex != nullptr ? hex : "?";
  OPENSSL_free(hex);
  BN_free(number);
  return out;
}

// Issuer and serial: what a list revokes by.
std::string KeyOf(const X509_NAME* issuer, const ASN1_INTEGER* serial) {
  return NameOf(issuer) + "#" + HexOf(serial);
}

// `missing` where the field is absent.
absl::Time TimeOf(const ASN1_TIME* t, absl::Time missing) {
  struct tm parts {};
  if (t == nullptr) return missing;
  if (ASN1_TIME_to_tm(t, &parts) != 1) return absl::InfinitePast();
  return absl::FromTM(parts, absl::UTCTimeZone());
}

}  // namespace

absl::StatusOr<RevocationSummary> ReadRevocationLists(const std::string& dir, const std::string& ca_path) {
  absl::StatusOr<std::string> bundle = ReadFileBounded(ca_path, 1 << 20);
  if (!bundle.ok()) return absl::NotFoundError(absl::StrCat("--tls_ca: ", bundle.status().message()));
  std::vector<X509Ptr> cas;
  BioPtr ca_bio = MemoryBio(*bundle);
  while (X509* x = PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr)) cas.emplace_back(x);
  if (cas.empty()) return absl::NotFoundError(absl::StrCat("--tls_ca: ", Quote(ca_path), " holds no certificate"));

  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("--tls_crl_dir: ", Quote(dir), " is not a directory"));
  std::vector<std::string> files;
  while (const dirent* e = ::readdir(d)) {
    if (Hashed(e->d_name) && files.size() < kMaxLists) files.push_back(e->d_name);
  }
  ::closedir(d);

  RevocationSummary out;
  std::vector<CrlPtr> newest(cas.size());  // each CA's newest list
  for (const std::string& file : files) {
    const std::string path = dir + "/" + file;
    absl::StatusOr<std::string> pem = ReadFileBounded(path, kMaxListBytes);
    if (!pem.ok()) return absl::InvalidArgumentError(absl::StrCat("--tls_crl_dir: ", pem.status().message()));
    BioPtr bio = MemoryBio(*pem);
    CrlPtr crl(PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr));
    if (crl == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls_crl_dir: ", Quote(path), " is not a PEM certificate revocation list"));
    }
    bool signed_by_a_ca = false;
    for (size_t i = 0; i < cas.size(); ++i) {
      if (X509_NAME_cmp(X509_CRL_get_issuer(crl.get()), X509_get_subject_name(cas[i].get())) != 0) continue;
      EVP_PKEY* key = X509_get0_pubkey(cas[i].get());
      if (key == nullptr || X509_CRL_verify(crl.get(), key) != 1) continue;
      signed_by_a_ca = true;
      if (newest[i] == nullptr ||
          TimeOf(X509_CRL_get0_lastUpdate(crl.get()), absl::InfinitePast()) >
              TimeOf(X509_CRL_get0_lastUpdate(newest[i].get()), absl::InfinitePast())) {
        X509_CRL_up_ref(crl.get());
        newest[i].reset(crl.get());
      }
    }
    if (!signed_by_a_ca) {
      return absl::InvalidArgumentError(absl::StrCat("--tls_crl_dir: ", Quote(path), " (issuer ",
                                                     NameOf(X509_CRL_get_issuer(crl.get())),
                                                     ") is signed by no CA of --tls_ca"));
    }
  }
  for (size_t i = 0; i < cas.size(); ++i) {
    const std::string ca = NameOf(X509_get_subject_name(cas[i].get()));
    if (newest[i] == nullptr) {
      if (out.missing_ca.empty()) out.missing_ca = ca;
      continue;
    }
    const absl::Time next = TimeOf(X509_CRL_get0_nextUpdate(newest[i].get()), absl::InfiniteFuture());
    if (next < out.next_update) {
      out.next_update = next;
      out.next_update_ca = ca;
    }
    STACK_OF(X509_REVOKED)* revoked = X509_CRL_get_REVOKED(newest[i].get());
    for (int r = 0; revoked != nullptr && r < sk_X509_REVOKED_num(revoked); ++r) {
      const X509_REVOKED* entry = sk_X509_REVOKED_value(revoked, r);
      out.revoked.emplace(KeyOf(X509_CRL_get_issuer(newest[i].get()), X509_REVOKED_get0_serialNumber(entry)),
                          TimeOf(X509_REVOKED_get0_revocationDate(entry), absl::InfinitePast()));
    }
  }
  return out;
}

absl::StatusOr<RevocationSummary> CheckRevocationLists(const std::string& dir, const std::string& ca_path,
                                                        absl::Time now) {
  absl::StatusOr<RevocationSummary> lists = ReadRevocationLists(dir, ca_path);
  if (!lists.ok()) return lists.status();
  if (!lists->missing_ca.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tls_crl_dir: ", Quote(dir), " holds no revocation list of CA ", lists->missing_ca,
        ": every certificate it signed would be refused (deploy/certs.sh DIR --crl writes one)"));
  }
  if (lists->next_update <= now) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tls_crl_dir: the revocation list of CA ", lists->next_update_ca, " in ", Quote(dir), " expired at ",
        absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", lists->next_update, absl::UTCTimeZone()),
        ": every certificate it signed would be refused (deploy/certs.sh DIR --crl writes a new one)"));
  }
  return lists;
}

std::string RevocationListsStamp(const std::string& dir, const std::string& ca_path) {
  std::vector<std::string> files = {ca_path};
  if (DIR* d = ::opendir(dir.c_str()); d != nullptr) {
    while (const dirent* e = ::readdir(d)) {
      if (Hashed(e->d_name) && files.size() <= kMaxLists) files.push_back(dir + "/" + e->d_name);
    }
    ::closedir(d);
  }
  std::sort(files.begin() + 1, files.end());
  std::string out;
  for (const std::string& path : files) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) continue;
    absl::StrAppend(&out, path, " ", st.st_size, " ", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, "\n");
  }
  return out;
}

absl::StatusOr<CertificateIdentity> IdentifyCertificate(absl::string_view pem) {
  if (pem.size() > (1 << 20)) return absl::InvalidArgumentError("a certificate chain over 1 MiB");
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) return absl::InvalidArgumentError("no PEM certificate");
  CertificateIdentity out;
  out.key = KeyOf(X509_get_issuer_name(cert.get()), X509_get0_serialNumber(cert.get()));
  out.subject = NameOf(X509_get_subject_name(cert.get()));
  out.serial = HexOf(X509_get0_serialNumber(cert.get()));
  return out;
}

}  // namespace shardline::common
