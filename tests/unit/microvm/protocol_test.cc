// The microvm wire protocol (runtime/microvm/protocol.h) and the host end of
// the channel (channel.h) against a fake guest: garbage, oversized and
// truncated frames fail that channel only, with an error naming the
// violation; well-formed replies come back byte-exact.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/unique_fd.h"
#include "runtime/microvm/channel.h"
#include "runtime/microvm/files.h"
#include "runtime/microvm/process.h"
#include "runtime/microvm/protocol.h"
#include "runtime/microvm/protocol_calls.h"
#include "status_matchers.h"

namespace warren::runtime::microvm {
namespace {

using proto::FrameDecoder;
using proto::FrameType;
using Result = FrameDecoder::Result;
using ::testing::HasSubstr;

std::string Header(uint32_t length, uint16_t type, uint16_t flags, uint64_t id) {
  std::string h;
  proto::PutLe(h, length, 4);
  proto::PutLe(h, type, 2);
  proto::PutLe(h, flags, 2);
  proto::PutLe(h, id, 8);
  return h;
}

TEST(FrameDecoderTest, DecodesFramesFedByteByByte) {
  std::string stream = proto::EncodeFrame(FrameType::kOutput, proto::kStreamStderr, 7, std::string("a\0b", 3)) +
                       proto::EncodeFrame(FrameType::kPong, 0, 8, "");
  FrameDecoder d;
  proto::Frame f;
  std::vector<proto::Frame> got;
  for (char c : stream) {
    d.Feed(std::string_view(&c, 1));
    while (d.Next(&f) == Result::kFrame) got.push_back(f);
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].type, FrameType::kOutput);
  EXPECT_EQ(got[0].flags, proto::kStreamStderr);
  EXPECT_EQ(got[0].id, 7u);
  EXPECT_EQ(got[0].payload, std::string("a\0b", 3));
  EXPECT_EQ(got[1].type, FrameType::kPong);
  EXPECT_EQ(d.pending(), 0u);
}

TEST(FrameDecoderTest, OversizedFrameIsRejectedBeforeItsPayloadArrives) {
  FrameDecoder d;
  d.Feed(Header(proto::kMaxPayload + 1, static_cast<uint16_t>(FrameType::kOutput), 1, 1));
  proto::Frame f;
  EXPECT_EQ(d.Next(&f), Result::kError);
  EXPECT_THAT(d.error(), HasSubstr("exceeds the maximum"));
  d.Feed(proto::EncodeFrame(FrameType::kPong, 0, 2, ""));  // a failed stream stays failed
  EXPECT_EQ(d.Next(&f), Result::kError);
}

TEST(FrameDecoderTest, UnknownTypeAndBadFlagsAreRejected) {
  for (const std::string& bad : {Header(0, 0, 0, 1), Header(0, 200, 0, 1), Header(0, 7, 3, 1), Header(0, 8, 1, 1)}) {
    FrameDecoder d;
    d.Feed(bad);
    proto::Frame f;
    EXPECT_EQ(d.Next(&f), Result::kError) << d.error();
    EXPECT_FALSE(d.error().empty());
  }
}

TEST(FrameDecoderTest, TruncatedFrameWaitsAndIsPending) {
  std::string frame = proto::EncodeFrame(FrameType::kExit, 0, 3, "xyz");
  FrameDecoder d;
  d.Feed(std::string_view(frame).substr(0, frame.size() - 1));
  proto::Frame f;
  EXPECT_EQ(d.Next(&f), Result::kNeedMore);
  EXPECT_EQ(d.pending(), frame.size() - 1);
}

TEST(FrameDecoderTest, RandomGarbageNeverCrashesAndNeverYieldsAnOversizedFrame) {
  std::srand(42);
  for (int round = 0; round < 2000; ++round) {
    std::string junk(static_cast<size_t>(std::rand() % 200), '\0');
    for (char& c : junk) c = static_cast<char>(std::rand());
    FrameDecoder d;
    d.Feed(junk);
    proto::Frame f;
    Result r;
    int frames = 0;
    while ((r = d.Next(&f)) == Result::kFrame) {
      EXPECT_LE(f.payload.size(), proto::kMaxPayload);
      ASSERT_LT(++frames, 100);
    }
    // Whatever the junk decodes to must also survive the message decoders.
    std::string why;
    proto::ExitResult e;
    proto::ErrorReply er;
    proto::HelloReply h;
    (void)proto::Decode(junk, &e, &why);
    (void)proto::Decode(junk, &er, &why);
    (void)proto::Decode(junk, &h, &why);
  }
}

TEST(MessageTest, ExecRequestRoundTripsByteExact) {
  proto::ExecRequest r;
  r.argv = {"printf", std::string("a\0b\xff", 4)};
  r.env = {"A=1", "B="};
  r.cwd = "/w";
  r.user = "1000:1000";
  r.timeout_ms = 1500;
  r.kill_grace_ms = 7;
  r.output_cap = 99;
  r.stdin_follows = true;
  proto::ExecRequest back;
  std::string why;
  ASSERT_TRUE(proto::Decode(proto::Encode(r), &back, &why)) << why;
  EXPECT_EQ(back.argv, r.argv);
  EXPECT_EQ(back.env, r.env);
  EXPECT_FALSE(back.shell.has_value());
  EXPECT_EQ(back.cwd, "/w");
  EXPECT_EQ(back.user, "1000:1000");
  EXPECT_EQ(back.timeout_ms, 1500u);
  EXPECT_EQ(back.kill_grace_ms, 7u);
  EXPECT_EQ(back.output_cap, 99u);
  EXPECT_TRUE(back.stdin_follows);
}

TEST(MessageTest, OutOfRangeAndMalformedRepliesAreRejected) {
  std::string why;
  proto::ExitResult e;
  EXPECT_FALSE(proto::Decode(proto::TlvWriter().U64(proto::tag::kExitCode, 1000).str(), &e, &why));
  EXPECT_THAT(why, HasSubstr("exit code 1000 out of range"));
  EXPECT_FALSE(
      proto::Decode(proto::TlvWriter().U64(proto::tag::kExitCode, 0).U64(proto::tag::kSignal, 65).str(), &e, &why));
  EXPECT_THAT(why, HasSubstr("signal 65"));
  EXPECT_FALSE(proto::Decode(proto::TlvWriter().Bytes(proto::tag::kExitCode, "abc").str(), &e, &why));
  EXPECT_FALSE(proto::Decode(proto::TlvWriter().U64(proto::tag::kSignal, 1).str(), &e, &why));
  EXPECT_THAT(why, HasSubstr("without an exit code"));
  // A record whose size overruns the payload.
  std::string overrun;
  proto::PutLe(overrun, proto::tag::kExitCode, 2);
  proto::PutLe(overrun, 1000, 4);
  overrun += "12345678";
  EXPECT_FALSE(proto::Decode(overrun, &e, &why));
  EXPECT_THAT(why, HasSubstr("overruns"));
  proto::ErrorReply er;
  EXPECT_FALSE(proto::Decode(proto::TlvWriter().U64(proto::tag::kCode, 99).str(), &er, &why));
  EXPECT_FALSE(
      proto::Decode(proto::TlvWriter().U64(proto::tag::kCode, 5).U64(proto::tag::kErrno, 1u << 20).str(), &er, &why));
  proto::HelloReply h;
  EXPECT_FALSE(proto::Decode(std::string(proto::kMaxStringField + 7, 'x'), &h, &why));
  EXPECT_FALSE(proto::Decode(proto::TlvWriter()
                                 .U64(proto::tag::kVersion, 1)
                                 .Bytes(proto::tag::kBootId, std::string(proto::kMaxStringField + 1, 'b'))
                                 .str(),
                             &h, &why));
  EXPECT_THAT(why, HasSubstr("too long"));
}

TEST(MessageTest, HelloWithRootSetupRoundTripsAndIsValidated) {
  proto::Hello h;
  h.realtime_ns = 1234567890123456789ull;
  h.seed = std::string(32, '\x07');
  h.setup_root = true;
  h.layers = 3;
  h.hostname = "sb-0123.x";
  h.shm_mb = 96;
  h.pids = 256;
  proto::Hello out;
  std::string why;
  ASSERT_TRUE(proto::Decode(proto::Encode(h), &out, &why)) << why;
  EXPECT_EQ(out.realtime_ns, h.realtime_ns);
  EXPECT_EQ(out.seed, h.seed);
  EXPECT_TRUE(out.setup_root);
  EXPECT_EQ(out.layers, 3u);
  EXPECT_EQ(out.hostname, "sb-0123.x");
  EXPECT_EQ(out.shm_mb, 96u);
  EXPECT_EQ(out.pids, 256u);
  EXPECT_FALSE(out.template_root);
  h.template_root = true;
  ASSERT_TRUE(proto::Decode(proto::Encode(h), &out, &why)) << why;
  EXPECT_TRUE(out.template_root);
  h.template_root = false;

  // Without setup_root the setup fields are not sent.
  proto::Hello plain;
  plain.hostname = "ignored";
  proto::Hello got;
  ASSERT_TRUE(proto::Decode(proto::Encode(plain), &got, &why)) << why;
  EXPECT_FALSE(got.setup_root);
  EXPECT_EQ(got.hostname, "");

  proto::Hello bad = h;
  bad.hostname = "a b";
  EXPECT_FALSE(proto::Decode(proto::Encode(bad), &got, &why));
  EXPECT_THAT(why, ::testing::HasSubstr("hostname"));
  bad = h;
  bad.hostname = std::string(65, 'a');
  EXPECT_FALSE(proto::Decode(proto::Encode(bad), &got, &why));
  bad = h;
  bad.layers = 0;
  got = proto::Hello{};
  EXPECT_FALSE(proto::Decode(proto::Encode(bad), &got, &why));
  EXPECT_THAT(why, ::testing::HasSubstr("layers"));
  bad = h;
  bad.layers = 65;
  got = proto::Hello{};
  EXPECT_FALSE(proto::Decode(proto::Encode(bad), &got, &why));
}

TEST(MessageTest, HelloWithANicRoundTripsAndIsValidated) {
  proto::Hello h;           // a cold boot's hello: no root setup, a NIC
  h.net_addr = 0x0ad50006;  // 10.213.0.6
  h.net_prefix = 30;
  h.net_gateway = 0x0ad50005;  // 10.213.0.5
  h.net_mac = std::string("\x02\x57\x0a\xd5\x00\x06", 6);
  h.nameserver = 0x0ad50005;
  proto::Hello out;
  std::string why;
  ASSERT_TRUE(proto::Decode(proto::Encode(h), &out, &why)) << why;
  EXPECT_FALSE(out.setup_root);
  EXPECT_EQ(out.net_addr, h.net_addr);
  EXPECT_EQ(out.net_prefix, 30u);
  EXPECT_EQ(out.net_gateway, h.net_gateway);
  EXPECT_EQ(out.net_mac, h.net_mac);
  EXPECT_EQ(out.nameserver, h.nameserver);

  // Without an address no NIC field is sent.
  proto::Hello none;
  none.net_prefix = 30;
  out = proto::Hello{};
  ASSERT_TRUE(proto::Decode(proto::Encode(none), &out, &why)) << why;
  EXPECT_EQ(out.net_addr, 0u);
  EXPECT_EQ(out.net_prefix, 0u);

  proto::HelloReply reply;
  reply.version = proto::kVersion;
  reply.nic = true;
  proto::HelloReply reply_out;
  ASSERT_TRUE(proto::Decode(proto::Encode(reply), &reply_out, &why)) << why;
  EXPECT_TRUE(reply_out.nic);

  auto refused = [&](const proto::Hello& bad, const char* what) {
    proto::Hello got;
    std::string w;
    EXPECT_FALSE(proto::Decode(proto::Encode(bad), &got, &w)) << what;
    EXPECT_THAT(w, ::testing::HasSubstr(what));
  };
  proto::Hello bad = h;
  bad.net_prefix = 31;
  refused(bad, "prefix");
  bad = h;
  bad.net_gateway = h.net_addr;  // itself
  refused(bad, "gateway");
  bad = h;
  bad.net_gateway = 0x0ad50009;  // another /30
  refused(bad, "gateway");
  bad = h;
  bad.net_mac = std::string("\x03\x57\x0a\xd5\x00\x06", 6);  // multicast
  refused(bad, "mac");
  bad = h;
  bad.net_mac = "short";
  refused(bad, "mac");
}

TEST(MessageTest, FindHelloReplySkipsWhatAnEarlierConnectionLeft) {
  std::string reply = proto::EncodeFrame(FrameType::kHelloReply, 0, 0xabcdef12345ull, "p");
  std::string stream = std::string("\x07\x00\x00\x00leftover", 12) + reply;
  EXPECT_EQ(proto::FindHelloReply(stream, 0xabcdef12345ull), 12u);
  EXPECT_EQ(proto::FindHelloReply(stream, 0xabcdef12346ull), std::string::npos);
  EXPECT_EQ(proto::FindHelloReply("", 1), std::string::npos);
}

// ---- the host end of the channel against a fake guest

class FakeGuest {
 public:
  // `script` runs on the accepted connection once the host's first request
  // after the hello (id `request_id`) arrived.
  explicit FakeGuest(const std::function<void(int fd, uint64_t request_id)>& script) {
    char tmpl[] = "/tmp/warren-mvm-test-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    path_ = dir_ + "/agent.sock";
    listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path_.c_str());
    EXPECT_EQ(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    EXPECT_EQ(::listen(listener_.get(), 1), 0);
    thread_ = std::thread([this, script] {
      UniqueFd c(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      FrameDecoder d;
      proto::Frame f;
      char buf[4096];
      auto next_frame = [&]() {
        while (d.Next(&f) != Result::kFrame) {
          ssize_t n = ::read(c.get(), buf, sizeof buf);
          if (n <= 0) return false;
          d.Feed(std::string_view(buf, static_cast<size_t>(n)));
        }
        return true;
      };
      // Answer every hello (the host sends a second one when the first
      // reply was slow: a loaded machine), then run the script on the first
      // request (as the agent does: never before it).
      for (bool first = true;; first = false) {
        if (!next_frame()) return;
        if (f.type != FrameType::kHello) break;
        proto::HelloReply r;
        r.version = proto::kVersion;
        r.kernel_release = "6.1-fake";
        std::string out = (first ? "stale bytes of an earlier connection" : "") +
                          proto::EncodeFrame(FrameType::kHelloReply, 0, f.id, proto::Encode(r));
        ASSERT_EQ(::write(c.get(), out.data(), out.size()), static_cast<ssize_t>(out.size()));
      }
      script(c.get(), f.id);
      // Keep the connection until the host closes it.
      while (::read(c.get(), buf, sizeof buf) > 0) {
      }
    });
  }
  ~FakeGuest() {
    thread_.join();
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
  UniqueFd listener_;
  std::thread thread_;
};

// A non-owning shared handle on a test's channel (the test keeps it alive).
std::shared_ptr<AgentChannel> Shared(const std::unique_ptr<AgentChannel>& c) {
  return std::shared_ptr<AgentChannel>(c.get(), [](AgentChannel*) {});
}
ChannelSource Source(const std::unique_ptr<AgentChannel>& c) {
  return [p = Shared(c)]() -> StatusOr<std::shared_ptr<AgentChannel>> { return p; };
}

void WriteAll(int fd, const std::string& s) {
  ASSERT_EQ(::write(fd, s.data(), s.size()), static_cast<ssize_t>(s.size()));
}

StatusOr<std::unique_ptr<AgentChannel>> Connect(const FakeGuest& g) {
  proto::HelloReply hello;
  auto ch = AgentChannel::Connect(
      "n0-t", g.path(), AgentChannel::Clock::now() + std::chrono::seconds(10), [] { return true; }, &hello);
  if (ch.ok()) {
    EXPECT_EQ(hello.kernel_release, "6.1-fake");
  }
  return ch;
}

proto::ExecRequest Echo() {
  proto::ExecRequest r;
  r.argv = {"echo"};
  r.output_cap = 4;
  return r;
}

TEST(AgentChannelTest, OutputIsCappedOnTheHostWhateverTheGuestSends) {
  FakeGuest g([](int fd, uint64_t id) {
    std::string s = proto::EncodeFrame(FrameType::kOutput, proto::kStreamStdout, id, std::string("ab\0cdef", 7));
    proto::ExitResult e;
    e.exit_code = 3;
    e.stdout_total = 2;  // a lie: the host saw 7
    s += proto::EncodeFrame(FrameType::kExit, 0, id, proto::Encode(e));
    WriteAll(fd, s);
  });
  ASSERT_OK_AND_ASSIGN(auto ch, Connect(g));
  ASSERT_OK_AND_ASSIGN(ExecOutcome out, ch->Exec(Echo(), "", std::chrono::seconds(10)));
  EXPECT_EQ(out.exit_code, 3);
  EXPECT_EQ(out.stdout_data, std::string("ab\0c", 4));
  EXPECT_EQ(out.stdout_total, 7u);
  EXPECT_TRUE(out.stdout_truncated);
  ch->Close();
}

TEST(AgentChannelTest, GarbageBreaksOnlyItsOwnChannel) {
  FakeGuest bad([](int fd, uint64_t) { WriteAll(fd, "this is not a frame header at all"); });
  FakeGuest good([](int fd, uint64_t id) {
    proto::ExitResult e;
    e.exit_code = 0;
    WriteAll(fd, proto::EncodeFrame(FrameType::kExit, 0, id, proto::Encode(e)));
  });
  ASSERT_OK_AND_ASSIGN(auto bad_ch, Connect(bad));
  ASSERT_OK_AND_ASSIGN(auto good_ch, Connect(good));
  EXPECT_THAT(bad_ch->Exec(Echo(), "", std::chrono::seconds(10)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("protocol violation by the guest")));
  // Later calls on the broken channel fail at once too.
  EXPECT_THAT(bad_ch->Ping(std::chrono::seconds(5)), StatusIs(absl::StatusCode::kUnavailable));
  ASSERT_OK_AND_ASSIGN(ExecOutcome out, good_ch->Exec(Echo(), "", std::chrono::seconds(10)));
  EXPECT_EQ(out.exit_code, 0);
  bad_ch->Close();
  good_ch->Close();
}

TEST(AgentChannelTest, OversizedFrameFailsTheCallWithoutReadingIt) {
  FakeGuest g([](int fd, uint64_t id) {
    WriteAll(fd, Header(64u << 20, static_cast<uint16_t>(FrameType::kOutput), 1, id) + "xx");
  });
  ASSERT_OK_AND_ASSIGN(auto ch, Connect(g));
  EXPECT_THAT(ch->Exec(Echo(), "", std::chrono::seconds(10)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("exceeds the maximum")));
  EXPECT_LT(ch->bytes_received(), 1024u);
  ch->Close();
}

TEST(AgentChannelTest, MalformedExitAndTruncatedStreamFailTheCall) {
  FakeGuest g([](int fd, uint64_t id) {
    WriteAll(fd, proto::EncodeFrame(FrameType::kExit, 0, id, proto::TlvWriter().U64(proto::tag::kSignal, 99).str()));
  });
  ASSERT_OK_AND_ASSIGN(auto ch, Connect(g));
  EXPECT_THAT(ch->Exec(Echo(), "", std::chrono::seconds(10)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("signal 99 out of range")));
  ch->Close();

  FakeGuest cut([](int fd, uint64_t id) {
    std::string f = proto::EncodeFrame(FrameType::kOutput, proto::kStreamStdout, id, "hello");
    WriteAll(fd, f.substr(0, f.size() - 2));
    ::shutdown(fd, SHUT_WR);  // the VM died mid-frame
  });
  ASSERT_OK_AND_ASSIGN(auto ch2, Connect(cut));
  EXPECT_THAT(ch2->Exec(Echo(), "", std::chrono::seconds(10)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("ended")));
  ch2->Close();
}

TEST(AgentChannelTest, SilentGuestHitsTheWaitBoundAndCloseEndsAPendingExecAsKilled) {
  FakeGuest g([](int, uint64_t) {});
  ASSERT_OK_AND_ASSIGN(auto ch, Connect(g));
  EXPECT_THAT(ch->Exec(Echo(), "", std::chrono::milliseconds(200)), StatusIs(absl::StatusCode::kDeadlineExceeded));
  std::thread closer([&] {
    ::usleep(100000);
    ch->Close();
  });
  ASSERT_OK_AND_ASSIGN(ExecOutcome out, ch->Exec(Echo(), "", std::chrono::milliseconds(0)));
  EXPECT_EQ(out.signal, SIGKILL);
  closer.join();
}

TEST(AgentChannelTest, ConnectTimesOutWhenNobodyListens) {
  proto::HelloReply hello;
  auto ch = AgentChannel::Connect(
      "n0-t", "/tmp/warren-no-such-dir/agent.sock", AgentChannel::Clock::now() + std::chrono::milliseconds(100),
      [] { return true; }, &hello);
  EXPECT_THAT(ch, StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("did not answer")));
  auto dead = AgentChannel::Connect(
      "n0-t", "/tmp/warren-no-such-dir/agent.sock", AgentChannel::Clock::now() + std::chrono::seconds(10),
      [] { return false; }, &hello);
  EXPECT_THAT(dead, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("QEMU exited")));
}

// ---- file calls and processes (protocol_calls.h)

TEST(FrameDecoderTest, CallFrameTypesAndTheirStreamFlags) {
  auto one = [](uint16_t type, uint16_t flags) {
    FrameDecoder d;
    d.Feed(Header(0, type, flags, 1));
    proto::Frame f;
    return d.Next(&f);
  };
  for (uint16_t t = 20; t <= 33; ++t) {
    uint16_t flags = (t == 25 || t == 26) ? 3 : 0;  // kProcOutput/kProcAck carry a stream
    EXPECT_EQ(one(t, flags), Result::kFrame) << t;
  }
  EXPECT_EQ(one(19, 0), Result::kError);
  EXPECT_EQ(one(34, 0), Result::kError);
  EXPECT_EQ(one(25, 4), Result::kError);  // no stream 4
  EXPECT_EQ(one(25, 0), Result::kError);
  EXPECT_EQ(one(21, 1), Result::kError);  // a file reply has no flags
  EXPECT_EQ(one(7, 3), Result::kError);   // exec output has no control stream
}

TEST(MessageTest, FileMessagesRoundTripByteExact) {
  proto::FileRequest q;
  q.op = proto::FileOp::kWrite;
  q.path = std::string("/w/\xff\x01name", 9);
  q.handle = 7;
  q.data = std::string("a\0b\xff", 4);
  proto::FileRequest q2;
  std::string why;
  ASSERT_TRUE(proto::Decode(proto::Encode(q), &q2, &why)) << why;
  EXPECT_EQ(q2.op, proto::FileOp::kWrite);
  EXPECT_EQ(q2.path, q.path);
  EXPECT_EQ(q2.data, q.data);
  EXPECT_EQ(q2.handle, 7u);

  proto::FileReply r;
  proto::WireFileInfo i;
  i.name = "x\xfe";
  i.path = "/w/x\xfe";
  i.type = 2;
  i.size = 1ull << 40;
  i.mode = 04755;
  i.uid = 65534;
  i.mtime_ns = -5;
  i.symlink_target = "../t";
  r.infos = {i, i};
  r.more = true;
  r.data = std::string(proto::kMaxChunk, '\0');
  proto::FileReply r2;
  ASSERT_TRUE(proto::Decode(proto::Encode(r), &r2, &why)) << why;
  ASSERT_EQ(r2.infos.size(), 2u);
  EXPECT_EQ(r2.infos[1].name, i.name);
  EXPECT_EQ(r2.infos[1].size, i.size);
  EXPECT_EQ(r2.infos[1].mtime_ns, -5);
  EXPECT_EQ(r2.infos[1].symlink_target, "../t");
  EXPECT_TRUE(r2.more);
  EXPECT_EQ(r2.data.size(), proto::kMaxChunk);
}

TEST(MessageTest, OutOfRangeCallMessagesAreRejected) {
  std::string why;
  auto bad_reply = [&](const std::string& payload) {
    proto::FileReply r;
    return !proto::Decode(payload, &r, &why);
  };
  using proto::TlvWriter;
  namespace ct = proto::ctag;
  EXPECT_TRUE(bad_reply(TlvWriter().Bytes(ct::kData, std::string(proto::kMaxChunk + 1, 'x')).str()));
  EXPECT_TRUE(bad_reply(TlvWriter().Bytes(ct::kInfo, TlvWriter().U64(ct::kType, 9).str()).str()));
  EXPECT_TRUE(bad_reply(TlvWriter().Bytes(ct::kInfo, TlvWriter().Bytes(ct::kName, std::string(256, 'n')).str()).str()));
  EXPECT_TRUE(bad_reply(TlvWriter().Bytes(ct::kInfo, TlvWriter().U64(ct::kInfoMode, 010000).str()).str()));
  EXPECT_TRUE(bad_reply(TlvWriter().Bytes(ct::kInfo, TlvWriter().U64(ct::kUid, 1ull << 32).str()).str()));
  EXPECT_TRUE(bad_reply(TlvWriter().Bytes(ct::kInfo, "\x01\x00\xff\xff").str()));  // truncated nested record
  TlvWriter many;
  for (size_t k = 0; k <= proto::kMaxListBatch; ++k) many.Bytes(ct::kInfo, "");
  EXPECT_TRUE(bad_reply(many.str()));
  EXPECT_THAT(why, HasSubstr("more than 1024"));

  proto::FileRequest q;
  EXPECT_FALSE(proto::Decode(TlvWriter().U64(ct::kOp, 99).str(), &q, &why));
  EXPECT_FALSE(proto::Decode(TlvWriter().U64(ct::kOp, 1).Bytes(ct::kPath, std::string("a\0b", 3)).str(), &q, &why));
  EXPECT_FALSE(proto::Decode(TlvWriter().U64(ct::kOp, 1).Bytes(ct::kPath, std::string(4097, 'p')).str(), &q, &why));
  EXPECT_FALSE(proto::Decode(TlvWriter().U64(ct::kOp, 10).U64(ct::kMax, proto::kMaxChunk + 1).str(), &q, &why));
  EXPECT_FALSE(proto::Decode(TlvWriter().Bytes(ct::kPath, "/x").str(), &q, &why));  // no op

  proto::ProcStarted st;
  EXPECT_FALSE(proto::Decode(TlvWriter().U64(ct::kPid, 0).str(), &st, &why));
  EXPECT_FALSE(proto::Decode(TlvWriter().U64(ct::kPid, 1ull << 40).str(), &st, &why));
  proto::ProcSignal sg;
  EXPECT_FALSE(proto::Decode(TlvWriter().U64(ct::kSignal, 65).str(), &sg, &why));
  proto::ProcResize rz;
  EXPECT_FALSE(proto::Decode(TlvWriter().U64(ct::kRows, 0).U64(ct::kCols, 80).str(), &rz, &why));
  proto::ProcAck ack;
  EXPECT_FALSE(proto::Decode(TlvWriter().U64(ct::kAckBytes, proto::kProcWindow + 1).str(), &ack, &why));
  proto::ExecRequest ex = Echo();
  ex.pty = true;
  ex.rows = 0;
  proto::ExecRequest ex2;
  EXPECT_FALSE(proto::Decode(proto::Encode(ex), &ex2, &why));
  EXPECT_THAT(why, HasSubstr("pty size"));
}

// Reads the host's next frame on `fd` (the fake guest's side).
bool NextFrame(int fd, FrameDecoder* d, proto::Frame* f) {
  char buf[4096];
  while (d->Next(f) != Result::kFrame) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    d->Feed(std::string_view(buf, static_cast<size_t>(n)));
  }
  return true;
}

std::string Reply(uint64_t id, const proto::FileReply& r) {
  return proto::EncodeFrame(FrameType::kFileReply, 0, id, proto::Encode(r));
}

TEST(AgentChannelTest, FileCallsCarryTheGuestsCodeAndErrno) {
  FakeGuest g([](int fd, uint64_t id) {
    proto::ErrorReply e;
    e.code = static_cast<uint64_t>(absl::StatusCode::kNotFound);
    e.err = ENOENT;
    e.message = "stat(/nope): No such file or directory [errno 2]";
    WriteAll(fd, proto::EncodeFrame(FrameType::kError, 0, id, proto::Encode(e)));
  });
  ASSERT_OK_AND_ASSIGN(auto ch, Connect(g));
  auto files = NewMicrovmFiles("t", Source(ch), std::chrono::seconds(10));
  StatusOr<FileInfo> st = files->Stat("/nope");
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kNotFound, HasSubstr("stat(/nope)")));
  EXPECT_EQ(StatusErrno(st.status()), ENOENT);
  ch->Close();
}

TEST(AgentChannelTest, AMalformedOrOversizedFileReplyBreaksOnlyItsChannel) {
  // Two entries for a stat.
  FakeGuest two([](int fd, uint64_t id) {
    proto::FileReply r;
    r.infos.resize(2);
    r.infos[0].name = r.infos[1].name = "x";
    WriteAll(fd, Reply(id, r));
  });
  // A read answered with more than was asked for.
  FakeGuest greedy([](int fd, uint64_t id) {
    proto::FileReply open;
    open.handle = 1;
    WriteAll(fd, Reply(id, open));
    FrameDecoder d;
    proto::Frame f;
    if (!NextFrame(fd, &d, &f)) return;
    proto::FileReply r;
    r.data = std::string(100, 'x');
    WriteAll(fd, Reply(f.id, r));
  });
  // An oversized frame in answer to a write.
  FakeGuest huge([](int fd, uint64_t id) {
    WriteAll(fd, Header(64u << 20, static_cast<uint16_t>(FrameType::kFileReply), 0, id) + "xx");
  });
  FakeGuest good([](int fd, uint64_t id) {
    proto::FileReply r;
    r.infos.resize(1);
    r.infos[0].name = "ok";
    r.infos[0].size = 42;
    WriteAll(fd, Reply(id, r));
  });
  ASSERT_OK_AND_ASSIGN(auto two_ch, Connect(two));
  ASSERT_OK_AND_ASSIGN(auto greedy_ch, Connect(greedy));
  ASSERT_OK_AND_ASSIGN(auto huge_ch, Connect(huge));
  ASSERT_OK_AND_ASSIGN(auto good_ch, Connect(good));
  auto violation = StatusIs(absl::StatusCode::kUnavailable, HasSubstr("protocol violation by the guest"));

  EXPECT_THAT(NewMicrovmFiles("t", Source(two_ch), std::chrono::seconds(10))->Stat("/x"), violation);
  EXPECT_THAT(two_ch->Ping(std::chrono::seconds(5)), StatusIs(absl::StatusCode::kUnavailable));

  auto greedy_files = NewMicrovmFiles("t", Source(greedy_ch), std::chrono::seconds(10));
  ASSERT_OK_AND_ASSIGN(auto reader, greedy_files->OpenRead("/x", 0, 0));
  EXPECT_THAT(reader->Read(10), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("100 bytes for 10 asked")));
  reader.reset();

  auto huge_files = NewMicrovmFiles("t", Source(huge_ch), std::chrono::seconds(10));
  EXPECT_THAT(huge_files->Mkdir("/d", 0755, false), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("exceeds")));
  EXPECT_LT(huge_ch->bytes_received(), 1024u);

  ASSERT_OK_AND_ASSIGN(FileInfo ok, NewMicrovmFiles("t", Source(good_ch), std::chrono::seconds(10))->Stat("/ok"));
  EXPECT_EQ(ok.size, 42u);
  for (auto* c : {two_ch.get(), greedy_ch.get(), huge_ch.get(), good_ch.get()}) c->Close();
}

std::string ReadAllFd(int fd) {
  std::string out;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

TEST(AgentChannelTest, ProcessStreamsRelayAndAcknowledgeOutput) {
  FakeGuest g([](int fd, uint64_t id) {
    proto::ProcStarted st;
    st.pid = 42;
    std::string s = proto::EncodeFrame(FrameType::kProcStarted, 0, id, proto::Encode(st));
    s += proto::EncodeFrame(FrameType::kProcOutput, proto::kStreamStdout, id, std::string("o\0ut", 4));
    s += proto::EncodeFrame(FrameType::kProcOutput, proto::kStreamStdout, id, "");
    s += proto::EncodeFrame(FrameType::kProcOutput, proto::kStreamStderr, id, "err");
    s += proto::EncodeFrame(FrameType::kProcOutput, proto::kStreamStderr, id, "");
    proto::ExitResult e;
    e.exit_code = 3;
    s += proto::EncodeFrame(FrameType::kProcExit, 0, id, proto::Encode(e));
    WriteAll(fd, s);
    // The host acknowledges both streams once the node's pipes took them.
    FrameDecoder d;
    proto::Frame f;
    uint64_t acked[4] = {0, 0, 0, 0};
    while ((acked[1] < 4 || acked[2] < 3) && NextFrame(fd, &d, &f)) {
      proto::ProcAck a;
      std::string why;
      if (f.type == FrameType::kProcAck && proto::Decode(f.payload, &a, &why)) acked[f.flags] += a.bytes;
    }
    EXPECT_EQ(acked[1], 4u);
    EXPECT_EQ(acked[2], 3u);
    WriteAll(fd, proto::EncodeFrame(FrameType::kProcTreeEmpty, 0, id, ""));
  });
  ASSERT_OK_AND_ASSIGN(auto ch, Connect(g));
  proto::ExecRequest req = Echo();
  ASSERT_OK_AND_ASSIGN(auto p, StartProcess(Shared(ch), req, StartOptions{}, std::chrono::seconds(10)));
  EXPECT_EQ(p->pid(), 42);
  UniqueFd out = p->TakeStdout(), err = p->TakeStderr();
  EXPECT_EQ(ReadAllFd(out.get()), std::string("o\0ut", 4));
  EXPECT_EQ(ReadAllFd(err.get()), "err");
  pollfd pf{p->pidfd(), POLLIN, 0};
  ASSERT_EQ(::poll(&pf, 1, 10000), 1);
  ExecOutcome o;
  ASSERT_OK_AND_ASSIGN(bool done, p->TryWait(&o));
  EXPECT_TRUE(done);
  EXPECT_EQ(o.exit_code, 3);
  for (int k = 0; k < 100 && !p->TreeEmpty(); ++k) ::usleep(20000);
  EXPECT_TRUE(p->TreeEmpty());
  EXPECT_THAT(p->Resize(10, 10), StatusIs(absl::StatusCode::kFailedPrecondition));
  p.reset();
  ch->Close();
}

TEST(AgentChannelTest, OutputBeyondTheCreditBreaksTheChannelAndEndsTheProcessAsKilled) {
  FakeGuest g([](int fd, uint64_t id) {
    proto::ProcStarted st;
    st.pid = 7;
    WriteAll(fd, proto::EncodeFrame(FrameType::kProcStarted, 0, id, proto::Encode(st)));
    // Past the credit (the node's pipe takes some); the host stops reading
    // once it saw the violation, so a send may come back short.
    std::string frame =
        proto::EncodeFrame(FrameType::kProcOutput, proto::kStreamStdout, id, std::string(proto::kMaxChunk, 'x'));
    for (uint64_t sent = 0; sent <= 2 * proto::kProcWindow; sent += proto::kMaxChunk) {
      if (::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(frame.size())) break;
    }
  });
  ASSERT_OK_AND_ASSIGN(auto ch, Connect(g));
  // Nobody reads stdout: the host holds at most the credit, then the guest
  // that ignores it is cut off.
  ASSERT_OK_AND_ASSIGN(auto p, StartProcess(Shared(ch), Echo(), StartOptions{}, std::chrono::seconds(10)));
  pollfd pf{p->pidfd(), POLLIN, 0};
  ASSERT_EQ(::poll(&pf, 1, 10000), 1);
  ExecOutcome o;
  ASSERT_OK_AND_ASSIGN(bool done, p->TryWait(&o));
  EXPECT_TRUE(done);
  EXPECT_EQ(o.signal, SIGKILL);
  EXPECT_THAT(ch->Ping(std::chrono::seconds(5)), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("credit")));
  p.reset();
  ch->Close();
}

TEST(AgentChannelTest, AProcessThatCannotStartReturnsTheGuestsError) {
  FakeGuest g([](int fd, uint64_t id) {
    proto::ErrorReply e;
    e.code = static_cast<uint64_t>(absl::StatusCode::kNotFound);
    e.err = ENOENT;
    e.message = "exec: chdir /nope: No such file or directory";
    WriteAll(fd, proto::EncodeFrame(FrameType::kError, 0, id, proto::Encode(e)));
  });
  ASSERT_OK_AND_ASSIGN(auto ch, Connect(g));
  EXPECT_THAT(StartProcess(Shared(ch), Echo(), StartOptions{}, std::chrono::seconds(10)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("chdir /nope")));
  ch->Close();
}

}  // namespace
}  // namespace warren::runtime::microvm
