#include "image/oci/registry.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <cctype>
#include <mutex>
#include <nlohmann/json.hpp>

#include "image/oci/manifest.h"

namespace warren::image::oci {
namespace {

constexpr size_t kMaxDocBytes = 4 << 20;
constexpr size_t kMaxErrorBody = 512;

bool ValidRepo(std::string_view r) {
  if (r.empty() || r.size() > 255 || r.front() == '/' || r.back() == '/') return false;
  for (char c : r) {
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '.' ||
          c == '_' || c == '-' || c == '/')) {
      return false;
    }
  }
  return r.find("//") == std::string_view::npos && r.find("..") == std::string_view::npos;
}

bool ValidTag(std::string_view t) {
  if (t.empty() || t.size() > 128 || t[0] == '.' || t[0] == '-') return false;
  for (char c : t) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) return false;
  }
  return true;
}

std::string Base64(std::string_view s) {
  std::string out(4 * ((s.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  out.resize(n);
  return out;
}

// The value of `key` in a challenge's comma-separated key="value" list.
std::string ChallengeParam(std::string_view ch, std::string_view key) {
  size_t pos = 0;
  while ((pos = ch.find(key, pos)) != std::string_view::npos) {
    bool at_start = pos == 0 || ch[pos - 1] == ' ' || ch[pos - 1] == ',';
    size_t eq = pos + key.size();
    if (at_start && eq + 1 < ch.size() && ch[eq] == '=' && ch[eq + 1] == '"') {
      size_t end = ch.find('"', eq + 2);
      if (end == std::string_view::npos) return "";
      return std::string(ch.substr(eq + 2, end - eq - 2));
    }
    pos = eq;
  }
  return "";
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace

std::string ImageRef::ToString() const { return host + "/" + repository + (digest.empty() ? ":" + tag : "@" + digest); }

StatusOr<ImageRef> ImageRef::Parse(std::string_view ref) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError("image ref \"" + std::string(ref.substr(0, 300)) + "\": " + why);
  };
  ImageRef r;
  size_t slash = ref.find('/');
  if (slash == std::string_view::npos || slash == 0) return bad("needs a registry host: host[:port]/repo[:tag]");
  r.host = std::string(ref.substr(0, slash));
  for (char c : r.host) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' || c == '[' || c == ']')) {
      return bad("host \"" + r.host + "\" has a character outside [A-Za-z0-9.:-[]]");
    }
  }
  std::string_view rest = ref.substr(slash + 1);
  if (size_t at = rest.find('@'); at != std::string_view::npos) {
    r.digest = std::string(rest.substr(at + 1));
    RETURN_IF_ERROR(CheckDigest(r.digest, "image ref"));
    rest = rest.substr(0, at);
  } else if (size_t colon = rest.rfind(':'); colon != std::string_view::npos && rest.find('/', colon) == rest.npos) {
    r.tag = std::string(rest.substr(colon + 1));
    if (!ValidTag(r.tag)) return bad("tag \"" + r.tag + "\" is not [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}");
    rest = rest.substr(0, colon);
  } else {
    r.tag = "latest";
  }
  r.repository = std::string(rest);
  if (!ValidRepo(r.repository)) return bad("repository \"" + r.repository + "\" is not lower-case [a-z0-9._/-]");
  return r;
}

bool IsLoopbackHost(std::string_view host) {
  std::string_view h = host;
  if (h.substr(0, 5) == "[::1]") return true;
  if (size_t c = h.find(':'); c != std::string_view::npos) h = h.substr(0, c);
  return h == "localhost" || h.substr(0, 4) == "127.";
}

struct RegistryClient::Response {
  long status = 0;
  std::string content_type;
  std::string www_authenticate;
  std::string error_body;
};

RegistryClient::RegistryClient(std::string host, RegistryOptions options)
    : host_(std::move(host)), options_(std::move(options)) {
  GlobalInit();
  if (!options_.bearer_token.empty()) auth_header_ = "Authorization: Bearer " + options_.bearer_token;
}

std::string RegistryClient::BaseUrl() const {
  return std::string(options_.plain_http ? "http://" : "https://") + host_ + "/v2/";
}

namespace {

struct Transfer {
  const std::function<Status(std::string_view)>* sink;
  const ProgressFn* progress;
  CURL* curl;
  Status sink_status;
  std::string* error_body;
  std::string* content_type;
  std::string* www_authenticate;
  bool cancelled = false;
};

size_t OnHeader(char* data, size_t size, size_t n, void* p) {
  auto* t = static_cast<Transfer*>(p);
  std::string_view line(data, size * n);
  if (line.substr(0, 5) == "HTTP/") {  // a new response (after a redirect): forget the last one's headers
    t->content_type->clear();
    t->www_authenticate->clear();
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return size * n;
  std::string key = Lower(line.substr(0, colon));
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' '))
    value.remove_suffix(1);
  if (key == "content-type") *t->content_type = std::string(value);
  if (key == "www-authenticate") *t->www_authenticate = std::string(value);
  return size * n;
}

size_t OnBody(char* data, size_t size, size_t n, void* p) {
  auto* t = static_cast<Transfer*>(p);
  long code = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &code);
  std::string_view chunk(data, size * n);
  if (code < 200 || code >= 300) {
    if (t->error_body->size() < kMaxErrorBody) {
      t->error_body->append(chunk.substr(0, kMaxErrorBody - t->error_body->size()));
    }
    return size * n;
  }
  t->sink_status = (*t->sink)(chunk);
  return t->sink_status.ok() ? size * n : 0;
}

int OnProgress(void* p, curl_off_t, curl_off_t now, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(p);
  if (*t->progress && !(*t->progress)(static_cast<uint64_t>(now))) {
    t->cancelled = true;
    return 1;
  }
  return 0;
}

}  // namespace

Status RegistryClient::GetOnce(const std::string& url, const std::string& accept, const std::string& auth,
                               const std::function<Status(std::string_view)>& sink, const ProgressFn& progress,
                               bool bounded_time, Response* resp) {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::InternalError("curl_easy_init failed");
  std::unique_ptr<CURL, void (*)(CURL*)> curl_guard(curl, curl_easy_cleanup);
  curl_slist* headers = nullptr;
  if (!accept.empty()) headers = curl_slist_append(headers, ("Accept: " + accept).c_str());
  if (!auth.empty()) headers = curl_slist_append(headers, auth.c_str());
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> headers_guard(headers, curl_slist_free_all);
  *resp = Response{};
  Transfer t{&sink, &progress, curl, absl::OkStatus(), &resp->error_body, &resp->content_type, &resp->www_authenticate};
  const long stall = options_.stall_timeout_s == 0 ? 30 : options_.stall_timeout_s;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // multithreaded daemon: no SIGALRM for DNS timeouts
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, stall);
  // A transfer that moves less than 1 byte/s for `stall` seconds (including
  // the wait for the answer's first byte) is given up.
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, stall);
  if (bounded_time) curl_easy_setopt(curl, CURLOPT_TIMEOUT, 4 * stall);
  if (!options_.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_file.c_str());
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, OnProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  CURLcode rc = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &resp->status);
  if (!t.sink_status.ok()) return t.sink_status;
  if (t.cancelled) return absl::CancelledError("GET " + url + ": cancelled");
  if (rc != CURLE_OK) {
    std::string msg = "GET " + url + ": " + (errbuf[0] != '\0' ? errbuf : curl_easy_strerror(rc));
    if (rc == CURLE_OPERATION_TIMEDOUT) {
      return absl::DeadlineExceededError(msg + " (the registry sent nothing for " + std::to_string(stall) + " s)");
    }
    if (rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CACERT_BADFILE || rc == CURLE_SSL_CONNECT_ERROR) {
      return absl::FailedPreconditionError(msg + " (TLS; give ca_file for a private CA, or plain_http)");
    }
    return absl::UnavailableError(msg);
  }
  return absl::OkStatus();
}

Status RegistryClient::Authenticate(const std::string& challenge, const std::string& url) {
  std::string scheme = Lower(challenge.substr(0, challenge.find(' ')));
  const bool have_basic = !options_.username.empty() || !options_.password.empty();
  const std::string basic = "Authorization: Basic " + Base64(options_.username + ":" + options_.password);
  if (scheme == "basic") {
    if (!have_basic)
      return absl::UnauthenticatedError("GET " + url +
                                        ": the registry asks for basic auth; give a username and password");
    auth_header_ = basic;
    return absl::OkStatus();
  }
  if (scheme != "bearer") {
    return absl::UnauthenticatedError("GET " + url + ": unsupported auth challenge \"" + challenge.substr(0, 100) +
                                      "\"");
  }
  std::string realm = ChallengeParam(challenge, "realm");
  if (realm.empty()) return absl::UnauthenticatedError("GET " + url + ": bearer challenge without a realm");
  CURL* esc = curl_easy_init();
  std::string token_url = realm;
  char sep = realm.find('?') == std::string::npos ? '?' : '&';
  for (const char* key : {"service", "scope"}) {
    std::string v = ChallengeParam(challenge, key);
    if (v.empty()) continue;
    char* e = curl_easy_escape(esc, v.c_str(), static_cast<int>(v.size()));
    token_url += sep + std::string(key) + "=" + e;
    curl_free(e);
    sep = '&';
  }
  curl_easy_cleanup(esc);
  std::string body;
  auto sink = [&](std::string_view chunk) -> Status {
    if (body.size() + chunk.size() > kMaxDocBytes) return absl::ResourceExhaustedError("token answer over 4 MiB");
    body.append(chunk);
    return absl::OkStatus();
  };
  Response resp;
  RETURN_IF_ERROR(GetOnce(token_url, "", have_basic ? basic : "", sink, nullptr, true, &resp));
  if (resp.status != 200) {
    return absl::UnauthenticatedError("GET " + token_url + ": HTTP " + std::to_string(resp.status) + " " +
                                      resp.error_body);
  }
  nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  std::string token;
  if (j.is_object()) {
    if (j.contains("token") && j["token"].is_string()) token = j["token"].get<std::string>();
    if (token.empty() && j.contains("access_token") && j["access_token"].is_string()) {
      token = j["access_token"].get<std::string>();
    }
  }
  if (token.empty()) return absl::UnauthenticatedError("GET " + token_url + ": answer has no token");
  auth_header_ = "Authorization: Bearer " + token;
  return absl::OkStatus();
}

Status RegistryClient::Get(const std::string& url, const std::string& accept,
                           const std::function<Status(std::string_view)>& sink, const ProgressFn& progress,
                           bool bounded_time, Response* resp) {
  RETURN_IF_ERROR(GetOnce(url, accept, auth_header_, sink, progress, bounded_time, resp));
  if (resp->status == 401 && !resp->www_authenticate.empty()) {
    RETURN_IF_ERROR(Authenticate(resp->www_authenticate, url));
    RETURN_IF_ERROR(GetOnce(url, accept, auth_header_, sink, progress, bounded_time, resp));
  }
  if (resp->status >= 200 && resp->status < 300) return absl::OkStatus();
  std::string msg = "GET " + url + ": HTTP " + std::to_string(resp->status);
  if (!resp->error_body.empty()) msg += ": " + resp->error_body;
  switch (resp->status) {
    case 404: return absl::NotFoundError(msg);
    case 401: return absl::UnauthenticatedError(msg);
    case 403: return absl::PermissionDeniedError(msg);
    case 429: return absl::ResourceExhaustedError(msg);
    default: return resp->status >= 500 ? absl::UnavailableError(msg) : absl::FailedPreconditionError(msg);
  }
}

StatusOr<RegistryClient::Manifest> RegistryClient::GetManifest(std::string_view repo, std::string_view reference) {
  Manifest m;
  auto sink = [&](std::string_view chunk) -> Status {
    if (m.body.size() + chunk.size() > kMaxDocBytes) {
      return absl::ResourceExhaustedError("manifest " + std::string(reference) + " is over 4 MiB");
    }
    m.body.append(chunk);
    return absl::OkStatus();
  };
  Response resp;
  const std::string url = BaseUrl() + std::string(repo) + "/manifests/" + std::string(reference);
  RETURN_IF_ERROR(Get(url, ManifestAccept(), sink, nullptr, true, &resp));
  m.content_type = resp.content_type;
  m.digest = "sha256:" + Sha256Hex(m.body);
  if (reference.substr(0, 7) == "sha256:" && m.digest != reference) {
    return absl::DataLossError("GET " + url + ": manifest digest mismatch: content has " + m.digest);
  }
  return m;
}

Status RegistryClient::GetBlob(std::string_view repo, std::string_view digest, HashingFile* out,
                               const ProgressFn& progress) {
  Response resp;
  const std::string url = BaseUrl() + std::string(repo) + "/blobs/" + std::string(digest);
  return Get(
      url, "", [out](std::string_view chunk) { return out->Write(chunk); }, progress, false, &resp);
}

StatusOr<std::string> RegistryClient::GetSmallBlob(std::string_view repo, std::string_view digest) {
  std::string body;
  auto sink = [&](std::string_view chunk) -> Status {
    if (body.size() + chunk.size() > kMaxDocBytes)
      return absl::ResourceExhaustedError("blob " + std::string(digest) + " is over 4 MiB");
    body.append(chunk);
    return absl::OkStatus();
  };
  Response resp;
  const std::string url = BaseUrl() + std::string(repo) + "/blobs/" + std::string(digest);
  RETURN_IF_ERROR(Get(url, "", sink, nullptr, true, &resp));
  if ("sha256:" + Sha256Hex(body) != digest) {
    return absl::DataLossError("GET " + url + ": digest mismatch: content has sha256:" + Sha256Hex(body));
  }
  return body;
}

}  // namespace warren::image::oci
