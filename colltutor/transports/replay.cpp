// Replay recorded messages on SimGrid's C++ engine: colltutor's simulated cluster
// without a Python thread per rank.
//
// The same simulation as colltutor/transports/simgrid.py (its World, SimTransport
// and run()) on a platform built from a description that
// colltutor/transports/simgrid_replay.py writes from the topology; each rank plays
// its record (colltutor/schedule.py: POST, WAIT, REDUCE entries).  A record holds
// one log per endpoint: endpoint e is lane e / ranks (a channel that progresses on
// its own, colltutor/collectives/at_once.py's lanes) of rank e % ranks, on that
// rank's host, started with that rank; below, "rank" in the engines means an
// endpoint, and a connection joins two endpoints.  Two ways, same
// simulated times: EventWorld (the default) makes each rank a state machine that
// starts its messages and CPU time as SimGrid activities and moves on when they
// complete, with no actor and no context switch; ActorWorld (--actors, the
// cross-check) makes each rank an actor that makes, call for call, the S4U calls
// the Python transport makes.
//
//   replay pairs SCHEDULE            the (sender, receiver) rank pairs the record uses
//   replay run JOB SCHEDULE [--actors] [--cfg=...]   the simulation; results on stdout
//
// JOB (text, one item per line): "semantics lockstep|fifo", "eager 0|1",
// "overhead S", "launch S", "reductions 0|1", "steps N", "speed F" (a host's
// flop/s, for the messages' CPU time), then the platform:
// "hosts N" and N lines "name speed cores"; "links N" and N lines "name bandwidth
// latency split|shared"; "routes N" and N lines "src_host dst_host hops (link
// U|D|N)..."; "ranks N" and N lines "host late"; "wires N" and N lines "src dst
// latency" (fifo: the latency a message waits after its last byte).
//
// Progress goes to stderr ("progress sent total clock"), the outcome to stdout.

#include <simgrid/kernel/Timer.hpp>
#include <simgrid/s4u.hpp>
#include <simgrid/version.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <list>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sg4 = simgrid::s4u;

namespace {

enum : int64_t { POST = 0, WAIT = 1, REDUCE = 2 };  // schedule.py's entry kinds

struct Schedule {  // schedule.py's file: b"CTSCHED2", ranks, endpoints, lengths, entries
  std::shared_ptr<void> mapping;  // the file, mapped
  const int64_t* data = nullptr;  // its entries
  std::vector<size_t> start;  // endpoint e's entries: data[start[e] .. start[e + 1])
  size_t ranks = 0;           // endpoint e lives on rank e % ranks
  size_t endpoints() const { return start.size() - 1; }
};

// The record, mapped from its file rather than copied: no copy, no zeroed pages.
Schedule read_schedule(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0)
    throw std::runtime_error("cannot open " + path);
  struct stat st {};
  void* map = fstat(fd, &st) == 0 && st.st_size > 0
                  ? mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0)
                  : MAP_FAILED;
  close(fd);
  if (map == MAP_FAILED)
    throw std::runtime_error("cannot map " + path);
  auto bytes = static_cast<size_t>(st.st_size);
  Schedule s;
  s.mapping = std::shared_ptr<void>(map, [bytes](void* m) { munmap(m, bytes); });
  madvise(map, bytes, MADV_WILLNEED);
  const auto* head = static_cast<const int64_t*>(map);  // magic, ranks, endpoints
  if (bytes < 24 || std::memcmp(map, "CTSCHED2", 8) != 0 || head[1] <= 0 || head[2] < head[1])
    throw std::runtime_error(path + " is not a colltutor schedule");
  auto endpoints = static_cast<size_t>(head[2]);
  if (bytes < 24 + 8 * endpoints)
    throw std::runtime_error(path + " is cut short");
  s.ranks = static_cast<size_t>(head[1]);
  s.start.push_back(0);
  for (size_t e = 0; e < endpoints; e++)
    s.start.push_back(s.start.back() + static_cast<size_t>(head[3 + e]));
  s.data = head + 3 + endpoints;
  if (bytes != 8 * (3 + endpoints + s.start.back()))
    throw std::runtime_error(path + " is cut short");
  return s;
}

// Calls fn(peer, bytes, is_send) for every message rank r posts.
template <class F> void each_message(const Schedule& s, size_t r, F fn) {
  const int64_t* log = s.data + s.start[r];
  size_t n = s.start[r + 1] - s.start[r];
  for (size_t i = 0; i < n;) {
    if (log[i] == POST) {
      int64_t sends = log[i + 1], recvs = log[i + 2];
      i += 3;
      for (int64_t k = 0; k < recvs + sends; k++, i += 2)
        fn(log[i], log[i + 1], k >= recvs);
    } else {
      i += 2;
    }
  }
}

struct Job {
  bool fifo = false, eager = false, reductions = false;
  double overhead = 0, launch = 0;
  unsigned steps = 8;
  std::vector<sg4::Host*> hosts;      // by rank
  std::vector<double> late;           // by rank
  std::unordered_map<uint64_t, double> wire_latency;  // src * ranks + dst
  double speed = 1e18;

  // endpoint e's host and late start: its rank's (e % ranks)
  sg4::Host* host(size_t e) const { return hosts[e % hosts.size()]; }
  double start(size_t e) const { return launch + late[e % late.size()]; }
  double latency(size_t src, size_t dst) const {  // fifo: the wire's, by rank pair
    size_t p = hosts.size();
    auto found = wire_latency.find((src % p) * p + dst % p);
    return found == wire_latency.end() ? 0.0 : found->second;
  }
};

std::string word(std::ifstream& in, const char* expected) {
  std::string w;
  if (!(in >> w) || (expected != nullptr && w != expected))
    throw std::runtime_error(std::string("job file: expected ") +
                             (expected ? expected : "a word"));
  return w;
}

double number(std::ifstream& in) {
  std::string w = word(in, nullptr);
  return std::strtod(w.c_str(), nullptr);  // Python's repr: the same double back
}

// Builds the platform the job describes: one Full zone, its hosts, its links and
// the routes listed, as colltutor.transports.simgrid.platform() builds them.
Job read_job(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw std::runtime_error("cannot open " + path);
  Job job;
  word(in, "semantics");
  job.fifo = word(in, nullptr) == "fifo";
  word(in, "eager");
  job.eager = number(in) != 0 || job.fifo;
  word(in, "overhead");
  job.overhead = number(in);
  word(in, "launch");
  job.launch = number(in);
  word(in, "reductions");
  job.reductions = number(in) != 0;
  word(in, "steps");
  job.steps = static_cast<unsigned>(number(in));
  word(in, "speed");
  job.speed = number(in);

  auto* zone = sg4::create_full_zone("cluster");
  word(in, "hosts");
  std::vector<sg4::Host*> hosts(static_cast<size_t>(number(in)));
  for (auto& host : hosts) {
    std::string name = word(in, nullptr);
    double speed = number(in);
    int cores = static_cast<int>(number(in));
    host = zone->create_host(name, speed)->set_core_count(cores)->seal();
  }
  word(in, "links");
  std::unordered_map<std::string, sg4::Link*> links;
  for (size_t n = static_cast<size_t>(number(in)); n > 0; n--) {
    std::string name = word(in, nullptr);
    double bandwidth = number(in), latency = number(in);
    std::string policy = word(in, nullptr);
    sg4::Link* link = policy == "split"
                          ? zone->create_split_duplex_link(name, bandwidth)->set_latency(latency)
                          : zone->create_link(name, bandwidth)->set_latency(latency);
    links[name] = link->seal();
  }
  word(in, "routes");
  for (size_t n = static_cast<size_t>(number(in)); n > 0; n--) {
    auto src = static_cast<size_t>(number(in)), dst = static_cast<size_t>(number(in));
    std::vector<sg4::LinkInRoute> hops;
    for (auto k = static_cast<size_t>(number(in)); k > 0; k--) {
      std::string name = word(in, nullptr), way = word(in, nullptr);
      auto found = links.find(name);
      if (found == links.end())
        throw std::runtime_error("job file: a route crosses unknown link " + name);
      auto dir = way == "U"   ? sg4::LinkInRoute::Direction::UP
                 : way == "D" ? sg4::LinkInRoute::Direction::DOWN
                              : sg4::LinkInRoute::Direction::NONE;
      hops.emplace_back(found->second, dir);
    }
    zone->add_route(hosts.at(src)->get_netpoint(), hosts.at(dst)->get_netpoint(), nullptr,
                    nullptr, hops, false);
  }
  zone->seal();
  word(in, "ranks");
  auto ranks = static_cast<size_t>(number(in));
  for (size_t r = 0; r < ranks; r++) {
    job.hosts.push_back(hosts.at(static_cast<size_t>(number(in))));
    job.late.push_back(number(in));
  }
  word(in, "wires");
  for (size_t n = static_cast<size_t>(number(in)); n > 0; n--) {
    auto src = static_cast<uint64_t>(number(in)), dst = static_cast<uint64_t>(number(in));
    job.wire_latency[src * ranks + dst] = number(in);
  }
  return job;
}

struct Message {  // what travels: its size, and (fifo) when it lands
  int64_t bytes;
  double due = -1;  // unset until its last byte has gone
};

struct Connection {  // World.box, World.credit, World.wires of one (src, dst)
  sg4::Mailbox* box = nullptr;
  sg4::SemaphorePtr credits;
  std::deque<Message*> queue;  // fifo: handed over, not yet on the wire
  sg4::SemaphorePtr ready;
  double latency = 0;
};

enum Kind : uint8_t { SEND, CREDIT, RECV };

struct Handle {  // _Send, _Credit, _Recv of simgrid.py
  sg4::CommPtr comm;
  Message* payload = nullptr;
  Connection* conn = nullptr;
  Kind kind = SEND;
  bool done = false;
};

// What both worlds count and report: when each rank finished, where a stuck
// one stopped, the messages sent, and the progress lines.
class Tally {
public:
  explicit Tally(const Schedule& s) {
    finished_.assign(s.endpoints(), -1);
    where_.assign(s.endpoints(), 0);
    for (size_t r = 0; r < s.endpoints(); r++)
      each_message(s, r, [this](int64_t, int64_t, bool send) { total_ += send; });
  }

  void report() const {
    double last = 0;
    std::vector<size_t> stuck;
    for (size_t r = 0; r < finished_.size(); r++) {
      if (finished_[r] < 0)
        stuck.push_back(r);
      else if (finished_[r] > last)
        last = finished_[r];
    }
    std::printf("seconds %.17g\nmessages %" PRId64 "\nbytes %" PRId64 "\n", last, messages_,
                bytes_);
    std::printf("stuck %zu", stuck.size());
    for (size_t r : stuck)
      std::printf(" %zu %zu", r, where_[r]);
    std::printf("\n");
    std::fflush(stdout);
  }

protected:
  std::vector<double> finished_;
  std::vector<size_t> where_;  // the entry a rank is at (a deadlock's report)
  int64_t messages_ = 0, bytes_ = 0, total_ = 0, posts_ = 0;
  std::chrono::steady_clock::time_point shown_ = std::chrono::steady_clock::now();

  void progress() {
    auto now = std::chrono::steady_clock::now();
    if (now - shown_ >= std::chrono::seconds(1)) {
      shown_ = now;
      std::fprintf(stderr, "progress %" PRId64 " %" PRId64 " %.9g\n", messages_, total_,
                   sg4::Engine::get_clock());
      std::fflush(stderr);
    }
  }
};

class ActorWorld : public Tally {  // one actor per rank, as simgrid.py runs them
public:
  ActorWorld(const Schedule& schedule, Job job) : Tally(schedule), s_(schedule), job_(std::move(job)) {
    actors_.resize(s_.endpoints());
  }

  void start() {
    for (size_t r = 0; r < s_.endpoints(); r++)
      actors_[r] = sg4::Actor::create("rank" + std::to_string(r), job_.host(r),
                                      [this, r] { rank(r); });
  }

private:
  const Schedule& s_;
  Job job_;
  std::vector<sg4::ActorPtr> actors_;
  std::unordered_map<uint64_t, Connection> connections_;

  Connection& connection(size_t src, size_t dst) {  // World.box and World.credit
    Connection& c = connections_[src * s_.endpoints() + dst];
    if (c.box == nullptr) {
      c.box = sg4::Mailbox::by_name(std::to_string(src) + ">" + std::to_string(dst));
      if (job_.eager)
        c.box->set_receiver(actors_[dst]);
      c.credits = sg4::Semaphore::create(job_.steps);
      c.latency = job_.latency(src, dst);
    }
    return c;
  }

  // World.owe / settle / busy, with the actor's debt on its stack
  void settle(double& owed) {
    if (owed != 0) {
      double flops = owed;
      owed = 0;
      sg4::this_actor::execute(flops);
    }
  }
  void busy(double& owed, int64_t messages) {
    if (job_.overhead != 0 && messages != 0) {
      owed += job_.overhead * job_.speed * static_cast<double>(messages);
      settle(owed);
    }
  }

  void enqueue(size_t src, size_t dst, Connection& c, Message* m) {  // World.enqueue
    if (!c.ready) {
      c.ready = sg4::Semaphore::create(0);
      sg4::Actor::create("wire" + std::to_string(src) + ">" + std::to_string(dst),
                         job_.host(src), [&c] { wire(c); });
    }
    c.queue.push_back(m);
    c.ready->release();
  }

  static void wire(Connection& c) {  // World._wire: one message after the other
    sg4::Actor::self()->daemonize();
    while (true) {
      c.ready->acquire();
      Message* m = c.queue.front();
      c.queue.pop_front();
      c.box->put(m, static_cast<uint64_t>(m->bytes));
      m->due = sg4::Engine::get_clock() + c.latency;
    }
  }

  void wait(Handle& h, double& owed) {
    switch (h.kind) {
      case SEND:  // _Send.wait
        settle(owed);
        if (!h.done) {
          h.comm->wait();
          h.comm = nullptr;
          h.done = true;
        }
        break;
      case CREDIT:  // _Credit.wait
        settle(owed);
        if (!h.done) {
          h.conn->credits->acquire();
          h.done = true;
        }
        break;
      case RECV: {  // _Recv.wait
        if (h.done)
          return;
        settle(owed);
        h.comm->wait();
        h.comm = nullptr;
        h.done = true;
        Message* m = h.payload;
        if (job_.fifo) {  // World.landed, then World.consumed
          double now = sg4::Engine::get_clock();
          double due = m->due >= 0 ? m->due : now + h.conn->latency;
          if (due > now)
            sg4::this_actor::sleep_until(due);
          h.conn->credits->release();
        }
        delete m;
        busy(owed, 1);
        break;
      }
    }
  }

  void rank(size_t r) {  // simgrid.run's actor with schedule.replayer's program
    double owed = 0;
    if (job_.start(r) != 0)
      sg4::this_actor::sleep_for(job_.start(r));
    const int64_t* log = s_.data + s_.start[r];
    size_t n = s_.start[r + 1] - s_.start[r];
    size_t posted = 0;
    each_message(s_, r, [&posted](int64_t, int64_t, bool) { posted++; });
    std::vector<Handle> handles;
    handles.reserve(posted);  // a receive's payload pointer must not move
    for (size_t i = 0; i < n;) {
      where_[r] = i;
      if (log[i] == WAIT) {
        wait(handles.at(static_cast<size_t>(log[i + 1])), owed);
        i += 2;
      } else if (log[i] == POST) {  // SimTransport.post
        int64_t sends = log[i + 1], recvs = log[i + 2];
        i += 3;
        busy(owed, sends);
        settle(owed);
        for (int64_t k = 0; k < recvs; k++, i += 2) {
          auto peer = static_cast<size_t>(log[i]);
          Handle& h = handles.emplace_back();
          h.kind = RECV;
          h.conn = &connection(peer, r);
          h.comm = h.conn->box->get_async<Message>(&h.payload);
        }
        for (int64_t k = 0; k < sends; k++, i += 2) {
          auto peer = static_cast<size_t>(log[i]);
          auto* m = new Message{log[i + 1]};
          Connection& c = connection(r, peer);
          Handle& h = handles.emplace_back();
          h.conn = &c;
          if (job_.fifo) {
            enqueue(r, peer, c, m);
            h.kind = CREDIT;
          } else {
            h.kind = SEND;
            h.comm = c.box->put_async(m, static_cast<uint64_t>(m->bytes));
          }
          messages_ += 1;
          bytes_ += m->bytes;
        }
        if ((++posts_ & 1023) == 0)
          progress();
      } else {  // REDUCE
        if (job_.reductions)
          owed += static_cast<double>(log[i + 1]);
        i += 2;
      }
    }
    where_[r] = n;
    settle(owed);
    finished_[r] = sg4::Engine::get_clock();
  }
};

// The same simulation without actors: each rank is a state machine over its
// record, started by a timer and advanced when the activity it waits for
// completes (Activity::on_completion, fired by SimGrid's kernel) or a timer
// fires (kernel::timer::Timer, what sleep_until's end is).  It starts the same
// activities at the same simulated instants as the actors above, with
// Comm::sendto (host to host, no mailbox) for a matched message and Exec for a
// rank's CPU time, so the times are the same; no actor, no context switch.
struct Waker {  // what an activity's completion advances
  bool is_message;
};

struct Wire;

struct Letter : Waker {  // one message, shared by its sender's and receiver's handles
  int64_t bytes = 0;
  Wire* wire = nullptr;
  sg4::CommPtr comm;
  bool arrived = false;  // its last byte is in
  double due = -1;       // fifo: when it lands
  int64_t sender = -1, receiver = -1;  // the ranks waiting for it
  int refs = 2;          // the handles (fifo: the wire's and the receiver's)
  Letter() : Waker{true} {}
};

struct Wire {  // one (src, dst): World.box, World.credit and World.wires
  sg4::Host* from = nullptr;
  sg4::Host* to = nullptr;
  std::deque<Letter*> sent, wanted;  // posted sends not yet received, and receives not yet sent
  std::deque<Letter*> queue;         // fifo: handed over, not yet on the wire
  bool sending = false;              // fifo: a message is on the wire
  unsigned credits = 0;
  int64_t blocked = -1;              // fifo: the sender waiting for a credit
  double latency = 0;
};

struct Note {  // a rank's handle on one posted message
  Letter* letter = nullptr;
  Wire* wire = nullptr;
  Kind kind = SEND;
  bool done = false;
};

struct Rank : Waker {  // where a rank is in its record
  size_t r = 0, i = 0;
  int stage = 0;  // the step within entry i that it is at
  double owed = 0;
  // Its handles: handle h in slot h & mask of a window that holds every handle
  // posted and not yet waited for the last time (sized from the record), so the
  // handles in use stay in the cache.
  std::vector<Note> notes;
  size_t posted = 0, mask = 0;
  sg4::ExecPtr exec;
  Rank() : Waker{false} {}
};

// SimGrid 3.32 and 3.33 keep the activities an actor started in a std::list and
// take each finished one off with list::remove (src/kernel/actor/ActorImpl.hpp:105;
// src/kernel/activity/CommImpl.cpp:115 and :546, ExecImpl.cpp:28 and :170, v3.32);
// 3.34 made it a std::set.  Started by maestro, as below, every activity in flight
// (thousands) is in maestro's one list and each completion walks all of it.  Our
// own handle keeps an activity alive, so its entry comes back off the list as soon
// as it is started.  The list is found once, as the one in maestro's ActorImpl
// whose single entry is the first activity started; not found, nothing changes
// but the speed.
class MaestroList {
  using List = std::list<simgrid::kernel::activity::ActivityImplPtr>;
  List* list_ = nullptr;
  bool searched_ = false;

  static List* find(const void* impl) {  // libstdc++'s list: {next, prev, size}
    const sg4::Actor* maestro = sg4::Actor::self();
    if (maestro == nullptr)
      return nullptr;
    auto* base = reinterpret_cast<char*>(maestro->get_impl());
    for (size_t offset = 0; offset + sizeof(List) <= 512; offset += alignof(List)) {
      auto* words = reinterpret_cast<void* const*>(base + offset);
      if (words[0] == nullptr || words[0] != words[1] || reinterpret_cast<uintptr_t>(words[2]) != 1)
        continue;
      auto* node = static_cast<void* const*>(words[0]);
      if (node[0] == base + offset && node[1] == base + offset && node[2] == impl)
        return reinterpret_cast<List*>(base + offset);
    }
    return nullptr;
  }

public:
  void forget(const sg4::Activity& started) {
#if SIMGRID_VERSION < 33400
    if (!searched_) {
      searched_ = true;
      list_ = find(started.get_impl());
    }
    if (list_ != nullptr && !list_->empty() && list_->back().get() == started.get_impl())
      list_->pop_back();
#else
    (void)started;
#endif
  }
};

class EventWorld : public Tally {
public:
  EventWorld(const Schedule& schedule, Job job) : Tally(schedule), s_(schedule), job_(std::move(job)) {
    std::set<sg4::Host*> hosts(job_.hosts.begin(), job_.hosts.end());
    alone_ = s_.endpoints() == job_.hosts.size() && hosts.size() == job_.hosts.size();
    ranks_.resize(s_.endpoints());
    for (size_t r = 0; r < s_.endpoints(); r++) {
      ranks_[r].r = r;
      size_t window = 1, needed = handles_in_use(r);
      while (window < needed)
        window *= 2;
      ranks_[r].notes.resize(window);
      ranks_[r].mask = window - 1;
    }
  }

  ~EventWorld() {
    for (Letter* m : spare_)
      delete m;
  }

  void start() {
    sg4::Activity::on_completion_cb([this](sg4::Activity const& a) { completed(a); });
    simgrid::kernel::timer::Timer::set(0.0, [this] {
      for (size_t r = 0; r < s_.endpoints(); r++) {
        double delay = job_.start(r);
        if (delay != 0)
          simgrid::kernel::timer::Timer::set(delay, [this, r] { woken(r); });
        else
          ready_.push_back(r);
      }
      drain();
    });
  }

private:
  const Schedule& s_;
  Job job_;
  std::vector<Rank> ranks_;
  std::unordered_map<uint64_t, Wire> wires_;
  std::deque<size_t> ready_;  // ranks to advance now
  std::vector<Letter*> spare_;  // messages delivered, for reuse
  // Every endpoint alone on its host: a rank's CPU time (one stretch at a time)
  // then never shares the host, and ends after flops / speed, as SimGrid's CPU
  // model would give it, with a timer rather than an activity.
  bool alone_ = false;
  bool draining_ = false;
  std::vector<sg4::ActivityPtr> retired_;  // completed; released at the next event
  MaestroList maestro_;

  // The most handles endpoint e holds at once: at each wait for handle h, those
  // posted since h, and h.
  size_t handles_in_use(size_t e) const {
    const int64_t* log = s_.data + s_.start[e];
    size_t n = s_.start[e + 1] - s_.start[e], posted = 0, most = 1;
    for (size_t i = 0; i < n;) {
      if (log[i] == POST) {
        posted += static_cast<size_t>(log[i + 1] + log[i + 2]);
        i += 3 + 2 * static_cast<size_t>(log[i + 1] + log[i + 2]);
        continue;
      }
      if (log[i] == WAIT) {
        auto h = static_cast<size_t>(log[i + 1]);
        if (h >= posted)
          throw std::runtime_error("a record waits on a message it has not posted");
        most = std::max(most, posted - h);
      }
      i += 2;
    }
    return most;
  }

  Letter* letter() {  // a fresh message, from the ones delivered before
    if (spare_.empty())
      return new Letter();
    Letter* m = spare_.back();
    spare_.pop_back();
    *m = Letter();
    return m;
  }

  Wire& wire(size_t src, size_t dst) {
    Wire& w = wires_[src * s_.endpoints() + dst];
    if (w.from == nullptr) {
      w.from = job_.host(src);
      w.to = job_.host(dst);
      w.credits = job_.steps;
      w.latency = job_.latency(src, dst);
    }
    return w;
  }

  void woken(size_t r) {
    retired_.clear();
    ready_.push_back(r);
    drain();
  }

  void drain() {  // advance every ready rank (once: a rank woken meanwhile queues)
    if (draining_)
      return;
    draining_ = true;
    while (!ready_.empty()) {
      size_t r = ready_.front();
      ready_.pop_front();
      advance(ranks_[r]);
    }
    draining_ = false;
  }

  void completed(sg4::Activity const& a) {
    retired_.clear();
    auto* waker = a.get_data<Waker>();
    if (waker == nullptr)
      return;
    if (!waker->is_message) {  // a rank's CPU time is over
      auto* k = static_cast<Rank*>(waker);
      retired_.push_back(k->exec);
      k->exec = nullptr;
      ready_.push_back(k->r);
    } else {
      auto* m = static_cast<Letter*>(waker);
      retired_.push_back(m->comm);
      m->comm = nullptr;
      m->arrived = true;
      for (int64_t* waiting : {&m->sender, &m->receiver})
        if (*waiting >= 0) {
          ready_.push_back(static_cast<size_t>(*waiting));
          *waiting = -1;
        }
      if (job_.fifo) {  // World._wire: the next message goes
        m->due = sg4::Engine::get_clock() + m->wire->latency;
        Wire* w = m->wire;
        release(m);
        w->sending = false;
        send_next(*w);
      }
    }
    drain();
  }

  void release(Letter* m) {
    if (--m->refs == 0)
      spare_.push_back(m);
  }

  void transmit(Letter* m) {
    m->comm = sg4::Comm::sendto_init(m->wire->from, m->wire->to);
    m->comm->set_payload_size(static_cast<uint64_t>(m->bytes));
    m->comm->set_data(static_cast<Waker*>(m));
    m->comm->start();
    maestro_.forget(*m->comm);
  }

  void send_next(Wire& w) {
    if (w.sending || w.queue.empty())
      return;
    Letter* m = w.queue.front();
    w.queue.pop_front();
    w.sending = true;
    transmit(m);
  }

  Letter* post_send(Wire& w, int64_t bytes) {  // put_async (lockstep) or World.enqueue (fifo)
    Letter* m;
    bool matched = !w.wanted.empty();
    if (matched) {
      m = w.wanted.front();
      w.wanted.pop_front();
    } else {
      m = letter();
      m->wire = &w;
      w.sent.push_back(m);
    }
    m->bytes = bytes;
    if (job_.fifo) {
      w.queue.push_back(m);
      send_next(w);
    } else if (job_.eager || matched) {  // eager: now; else once both are posted
      transmit(m);
    }
    return m;
  }

  Letter* post_recv(Wire& w) {  // get_async
    if (!w.sent.empty()) {
      Letter* m = w.sent.front();
      w.sent.pop_front();
      if (!job_.fifo && !job_.eager)
        transmit(m);
      return m;
    }
    auto* m = letter();
    m->wire = &w;
    w.wanted.push_back(m);
    return m;
  }

  // World.owe / settle / busy: the rank's debt as one Exec on its host
  bool settle(Rank& k) {
    if (k.owed == 0)
      return false;
    if (alone_) {  // the host's one rank computes alone: flops / speed, a timer
      double due = sg4::Engine::get_clock() + k.owed / job_.host(k.r)->get_speed();
      size_t r = k.r;
      k.owed = 0;
      simgrid::kernel::timer::Timer::set(due, [this, r] { woken(r); });
      return true;
    }
    k.exec = sg4::Exec::init();
    k.exec->set_flops_amount(k.owed)->set_host(job_.host(k.r));
    k.exec->set_data(static_cast<Waker*>(&k));
    k.owed = 0;
    k.exec->start();
    maestro_.forget(*k.exec);
    return true;
  }
  bool busy(Rank& k, int64_t messages) {
    if (job_.overhead == 0 || messages == 0)
      return false;
    k.owed += job_.overhead * job_.speed * static_cast<double>(messages);
    return settle(k);
  }

  void post(Rank& k, const int64_t* entry) {  // SimTransport.post's messages
    int64_t sends = entry[1], recvs = entry[2];
    const int64_t* peer = entry + 3;
    for (int64_t j = 0; j < recvs; j++, peer += 2) {
      Note& h = k.notes[k.posted++ & k.mask];
      h = Note();
      h.kind = RECV;
      h.wire = &wire(static_cast<size_t>(peer[0]), k.r);
      h.letter = post_recv(*h.wire);
    }
    for (int64_t j = 0; j < sends; j++, peer += 2) {
      Note& h = k.notes[k.posted++ & k.mask];
      h = Note();
      h.wire = &wire(k.r, static_cast<size_t>(peer[0]));
      h.kind = job_.fifo ? CREDIT : SEND;
      Letter* m = post_send(*h.wire, peer[1]);
      h.letter = job_.fifo ? nullptr : m;
      messages_ += 1;
      bytes_ += peer[1];
    }
    if ((++posts_ & 1023) == 0)
      progress();
  }

  // Runs rank k's record from where it stopped until it must wait: the actor's
  // program (ActorWorld::rank and wait), cut at each blocking call.
  void advance(Rank& k) {
    const int64_t* log = s_.data + s_.start[k.r];
    size_t n = s_.start[k.r + 1] - s_.start[k.r];
    while (k.i < n) {
      where_[k.r] = k.i;
      const int64_t* entry = log + k.i;
      if (entry[0] == REDUCE) {
        if (job_.reductions)
          k.owed += static_cast<double>(entry[1]);
        k.i += 2;
        continue;
      }
      if (entry[0] == POST) {
        if (k.stage == 0 && (k.stage = 1, busy(k, entry[1])))
          return;
        if (k.stage == 1 && (k.stage = 2, settle(k)))
          return;
        post(k, entry);
        k.i += 3 + 2 * static_cast<size_t>(entry[1] + entry[2]);
        k.stage = 0;
        continue;
      }
      Note& h = k.notes[static_cast<size_t>(entry[1]) & k.mask];  // WAIT
      if (!wait(k, h))
        return;
      k.i += 2;
      k.stage = 0;
    }
    where_[k.r] = n;
    if (k.stage == 0 && (k.stage = 1, settle(k)))
      return;
    if (k.stage == 1) {
      k.stage = 2;
      finished_[k.r] = sg4::Engine::get_clock();
    }
  }

  bool wait(Rank& k, Note& h) {  // false: not yet (advance(k) again when woken)
    if (h.kind == RECV && k.stage == 0 && h.done)
      return true;
    if (k.stage == 0 && (k.stage = 1, settle(k)))
      return false;
    if (h.kind == SEND) {  // _Send.wait
      if (!h.done) {
        if (!h.letter->arrived) {
          h.letter->sender = static_cast<int64_t>(k.r);
          return false;
        }
        h.done = true;
        release(h.letter);
      }
      return true;
    }
    if (h.kind == CREDIT) {  // _Credit.wait
      if (!h.done) {
        if (h.wire->credits == 0) {
          h.wire->blocked = static_cast<int64_t>(k.r);
          return false;
        }
        h.wire->credits--;
        h.done = true;
      }
      return true;
    }
    Letter* m = h.letter;  // _Recv.wait
    if (k.stage == 1) {
      if (!m->arrived) {
        m->receiver = static_cast<int64_t>(k.r);
        return false;
      }
      h.done = true;
      k.stage = 2;
      if (job_.fifo) {  // World.landed
        double now = sg4::Engine::get_clock();
        double due = m->due >= 0 ? m->due : now + h.wire->latency;
        if (due > now) {
          size_t r = k.r;
          simgrid::kernel::timer::Timer::set(due, [this, r] { woken(r); });
          return false;
        }
      }
    }
    if (k.stage == 2) {
      k.stage = 3;
      if (job_.fifo) {  // World.consumed
        Wire& w = *h.wire;
        w.credits++;
        if (w.blocked >= 0) {
          ready_.push_back(static_cast<size_t>(w.blocked));
          w.blocked = -1;
        }
      }
      h.letter = nullptr;
      release(m);
      if (busy(k, 1))
        return false;
    }
    return true;
  }
};

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc >= 3 && std::string(argv[1]) == "pairs") {
      Schedule s = read_schedule(argv[2]);
      std::set<std::pair<size_t, size_t>> pairs;  // by rank, whatever the lane
      for (size_t e = 0; e < s.endpoints(); e++)
        each_message(s, e, [&pairs, &s, e](int64_t peer, int64_t, bool send) {
          if (send)
            pairs.emplace(e % s.ranks, static_cast<size_t>(peer) % s.ranks);
        });
      for (auto [src, dst] : pairs)
        std::printf("%zu %zu\n", src, dst);
      return 0;
    }
    if (argc < 4 || std::string(argv[1]) != "run") {
      std::fprintf(stderr, "usage: %s pairs SCHEDULE | run JOB SCHEDULE [--cfg=...]\n",
                   argv[0]);
      return 2;
    }
    std::string job_path = argv[2], schedule_path = argv[3];
    std::vector<char*> args{argv[0]};
    bool actors = false;
    for (int i = 4; i < argc; i++) {
      if (std::string(argv[i]) == "--actors")
        actors = true;
      else
        args.push_back(argv[i]);
    }
    int count = static_cast<int>(args.size());
    args.push_back(nullptr);
    sg4::Engine engine(&count, args.data());
    Schedule schedule = read_schedule(schedule_path);
    Job job = read_job(job_path);
    if (job.hosts.size() != schedule.ranks)
      throw std::runtime_error("the job's ranks and the schedule's differ");
    if (actors) {
      ActorWorld world(schedule, std::move(job));
      world.start();
      engine.run();
      world.report();
    } else {
      EventWorld world(schedule, std::move(job));
      world.start();
      engine.run();
      world.report();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error %s\n", e.what());
    return 1;
  }
  return 0;
}
