// braid/nn/checkpoint.hpp — one-file checkpoints: named tensors, integers, reals and strings.
//
// File layout (little-endian): "BRAIDCK1", u64 entry count, then per entry: u32 name length, name,
// u8 kind, u64 byte count, bytes; finally u32 CRC-32 (zlib) of everything before it. save() writes a
// temporary file beside the target, fsyncs it, renames it over the target and fsyncs the directory,
// so a reader sees the old file or the new one, never a partial one. load() checks the magic, every
// length and the CRC and raises invalid_argument naming the file otherwise.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "optim.hpp"

namespace braid::nn {

class checkpoint {
public:
  enum class kind : std::uint8_t { tensor_f32 = 1, tensor_f64 = 2, tensor_bf16 = 3, tensor_f16 = 4, i64 = 10, f64 = 11, str = 12 };

  void put(const std::string& name, const tensor& t) {
    entry& e = entries_[name];
    e.k = t.type() == dtype::float32 ? kind::tensor_f32 : t.type() == dtype::float64 ? kind::tensor_f64
        : t.type() == dtype::bfloat16 ? kind::tensor_bf16 : kind::tensor_f16;
    e.bytes.assign(static_cast<const std::uint8_t*>(t.raw()), static_cast<const std::uint8_t*>(t.raw()) + t.bytes());
  }
  // Copies the entry into t, which must have the saved type and element count.
  void get(const std::string& name, const tensor& t) const {
    const entry& e = find(name);
    const kind want = t.type() == dtype::float32 ? kind::tensor_f32 : t.type() == dtype::float64 ? kind::tensor_f64
                    : t.type() == dtype::bfloat16 ? kind::tensor_bf16 : kind::tensor_f16;
    if (e.k != want || e.bytes.size() != t.bytes())
      raise(errc::invalid_argument, "checkpoint: entry '" + name + "' does not match the tensor " + t.shape().str() +
                                        " of " + std::string(braid::name(t.type())));
    if (!e.bytes.empty()) std::memcpy(t.raw(), e.bytes.data(), e.bytes.size());
  }
  void put_int(const std::string& name, std::int64_t v) { put_scalar(name, kind::i64, &v, sizeof v); }
  void put_real(const std::string& name, double v) { put_scalar(name, kind::f64, &v, sizeof v); }
  void put_string(const std::string& name, const std::string& s) {
    entry& e = entries_[name];
    e.k = kind::str;
    e.bytes.assign(s.begin(), s.end());
  }
  std::int64_t get_int(const std::string& name) const { return get_scalar<std::int64_t>(name, kind::i64); }
  double get_real(const std::string& name) const { return get_scalar<double>(name, kind::f64); }
  std::string get_string(const std::string& name) const {
    const entry& e = find(name);
    if (e.k != kind::str) raise(errc::invalid_argument, "checkpoint: entry '" + name + "' is not a string");
    return std::string(e.bytes.begin(), e.bytes.end());
  }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  std::size_t size() const { return entries_.size(); }

  // The engine's state as text (the standard's operator<< form), and back.
  void put_rng(const std::string& name, const std::mt19937_64& g) {
    std::ostringstream os;
    os << g;
    put_string(name, os.str());
  }
  void get_rng(const std::string& name, std::mt19937_64& g) const {
    std::istringstream is(get_string(name));
    is >> g;
    if (!is) raise(errc::invalid_argument, "checkpoint: entry '" + name + "' is not a random engine state");
  }

  // Parameters ("<prefix>param.<i>") and buffers ("<prefix>buffer.<i>") of a module, in collect() order.
  template <class T> void put_module(const std::string& prefix, module<T>& m) {
    auto ps = m.parameters();
    auto bs = m.buffers();
    for (std::size_t i = 0; i < ps.size(); ++i) put(prefix + "param." + std::to_string(i), ps[i]->value);
    for (std::size_t i = 0; i < bs.size(); ++i) put(prefix + "buffer." + std::to_string(i), *bs[i]);
    put_int(prefix + "count", std::int64_t(ps.size() * 1000000 + bs.size()));
  }
  template <class T> void get_module(const std::string& prefix, module<T>& m) const {
    auto ps = m.parameters();
    auto bs = m.buffers();
    if (get_int(prefix + "count") != std::int64_t(ps.size() * 1000000 + bs.size()))
      raise(errc::invalid_argument, "checkpoint: the model has a different number of parameters or buffers");
    for (std::size_t i = 0; i < ps.size(); ++i) get(prefix + "param." + std::to_string(i), ps[i]->value);
    for (std::size_t i = 0; i < bs.size(); ++i) get(prefix + "buffer." + std::to_string(i), *bs[i]);
  }
  template <class T> void put_optimizer(const std::string& prefix, optimizer<T>& o) {
    put_string(prefix + "name", o.name());
    put_int(prefix + "steps", o.step_counter());
    auto st = o.state();
    put_int(prefix + "count", std::int64_t(st.size()));
    for (std::size_t i = 0; i < st.size(); ++i) put(prefix + "state." + std::to_string(i), *st[i]);
  }
  template <class T> void get_optimizer(const std::string& prefix, optimizer<T>& o) const {
    if (get_string(prefix + "name") != o.name())
      raise(errc::invalid_argument, "checkpoint: saved optimizer is " + get_string(prefix + "name") + ", not " + o.name());
    auto st = o.state();
    if (get_int(prefix + "count") != std::int64_t(st.size()))
      raise(errc::invalid_argument, "checkpoint: optimizer state does not match");
    o.step_counter() = get_int(prefix + "steps");
    for (std::size_t i = 0; i < st.size(); ++i) get(prefix + "state." + std::to_string(i), *st[i]);
  }

  // Writes atomically (temporary file, fsync, rename, fsync of the directory).
  void save(const std::string& path) const {
    std::vector<std::uint8_t> buf(magic, magic + 8);
    append(buf, std::uint64_t{entries_.size()});
    for (const auto& [name, e] : entries_) {
      append(buf, std::uint32_t(name.size()));
      buf.insert(buf.end(), name.begin(), name.end());
      buf.push_back(std::uint8_t(e.k));
      append(buf, std::uint64_t{e.bytes.size()});
      buf.insert(buf.end(), e.bytes.begin(), e.bytes.end());
    }
    append(buf, std::uint32_t(crc32_z(0L, buf.data(), buf.size())));
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) braid::detail::raise_errno(("open " + tmp).c_str(), __FILE__, __LINE__, errno);
    std::size_t done = 0;
    while (done < buf.size()) {
      const ssize_t w = ::write(fd, buf.data() + done, buf.size() - done);
      if (w < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        braid::detail::raise_errno(("write " + tmp).c_str(), __FILE__, __LINE__, e);
      }
      done += std::size_t(w);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      braid::detail::raise_errno(("fsync/close " + tmp).c_str(), __FILE__, __LINE__, e);
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      braid::detail::raise_errno(("rename to " + path).c_str(), __FILE__, __LINE__, e);
    }
    const std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/') + 1);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

  static checkpoint load(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) raise(errc::invalid_argument, "checkpoint: cannot open " + path + ": " + std::strerror(errno));
    std::vector<std::uint8_t> buf;
    std::uint8_t chunk[1 << 16];
    for (;;) {
      const ssize_t r = ::read(fd, chunk, sizeof chunk);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      buf.insert(buf.end(), chunk, chunk + r);
    }
    ::close(fd);
    auto bad = [&](const char* why) { raise(errc::invalid_argument, "checkpoint " + path + ": " + why); };
    if (buf.size() < 20 || std::memcmp(buf.data(), magic, 8) != 0) bad("not a braid checkpoint");
    std::uint32_t crc;
    std::memcpy(&crc, buf.data() + buf.size() - 4, 4);
    if (crc != std::uint32_t(crc32_z(0L, buf.data(), buf.size() - 4))) bad("CRC mismatch (corrupt or truncated)");
    std::size_t at = 8;
    const std::size_t end = buf.size() - 4;
    auto take = [&](void* p, std::size_t n) {
      if (n > end - at) bad("truncated entry");
      std::memcpy(p, buf.data() + at, n);
      at += n;
    };
    std::uint64_t count;
    take(&count, 8);
    checkpoint c;
    for (std::uint64_t i = 0; i < count; ++i) {
      std::uint32_t len;
      take(&len, 4);
      std::string name(len, '\0');
      take(name.data(), len);
      std::uint8_t k;
      take(&k, 1);
      std::uint64_t nb;
      take(&nb, 8);
      if (nb > end - at) bad("truncated entry");
      entry& e = c.entries_[name];
      e.k = kind(k);
      e.bytes.assign(buf.begin() + std::ptrdiff_t(at), buf.begin() + std::ptrdiff_t(at + nb));
      at += nb;
    }
    if (at != end) bad("trailing bytes");
    return c;
  }

private:
  struct entry {
    kind k = kind::i64;
    std::vector<std::uint8_t> bytes;
  };
  static constexpr char magic[9] = "BRAIDCK1";

  template <class V> static void append(std::vector<std::uint8_t>& b, V v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof v);
  }
  void put_scalar(const std::string& name, kind k, const void* p, std::size_t n) {
    entry& e = entries_[name];
    e.k = k;
    e.bytes.assign(static_cast<const std::uint8_t*>(p), static_cast<const std::uint8_t*>(p) + n);
  }
  template <class V> V get_scalar(const std::string& name, kind k) const {
    const entry& e = find(name);
    if (e.k != k || e.bytes.size() != sizeof(V))
      raise(errc::invalid_argument, "checkpoint: entry '" + name + "' has another type");
    V v;
    std::memcpy(&v, e.bytes.data(), sizeof v);
    return v;
  }
  const entry& find(const std::string& name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) raise(errc::invalid_argument, "checkpoint: no entry '" + name + "'");
    return it->second;
  }
  std::map<std::string, entry> entries_;
};

} // namespace braid::nn
