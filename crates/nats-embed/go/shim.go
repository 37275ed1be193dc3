// Package main is the C-callable shim around nats-server that kine-rs carries as a shared
// library (go build -buildmode=c-shared) and loads when it starts the embedded server. One server per process; every function is safe to
// call from any thread. Strings returned to Rust are C strings that Rust frees with
// KineNatsFree.
package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/nats-io/nats-server/v2/server"
)

// startOptions is what Rust asks for (JSON). Empty or zero fields mean "not given".
type startOptions struct {
	Host            string `json:"host"`
	Port            int    `json:"port"`
	PortGiven       bool   `json:"port_given"`
	ForceLoopback   bool   `json:"force_loopback"`
	ConfigFile      string `json:"config_file"`
	StoreDir        string `json:"store_dir"`
	DefaultStoreDir string `json:"default_store_dir"`
	User            string `json:"user"`
	Password        string `json:"password"`
	Token           string `json:"token"`
	StdoutLogging   bool   `json:"stdout_logging"`
	SyncAlways      bool   `json:"sync_always"`
	SyncIntervalMs  int64  `json:"sync_interval_ms"`
	MaxPayload      int32  `json:"max_payload"`
}

// serverInfo is what Rust learns once the server is ready (JSON).
type serverInfo struct {
	ClientURL   string `json:"client_url"`
	ListenHost  string `json:"listen_host"`
	ListenPort  int    `json:"listen_port"`
	ServerName  string `json:"server_name"`
	StoreDir    string `json:"store_dir"`
	Cluster     string `json:"cluster"`
	ClusterAddr string `json:"cluster_addr"`
	LeafAddr    string `json:"leafnode_addr"`
	Remotes     int    `json:"leafnode_remotes"`
	AuthSource  string `json:"auth_source"`
	SyncAlways  bool   `json:"sync_always"`
	SyncMs      int64  `json:"sync_interval_ms"`
	MaxPayload  int32  `json:"max_payload"`
	MaxControl  int32  `json:"max_control_line"`
}

var (
	mu         sync.Mutex
	srv        *server.Server
	srvOpts    *server.Options
	authSource string
	logs       = make(chan string, 1024)
	logsClosed bool
	fatal      string
	stopped    bool
)

// logger forwards warnings and errors to Rust (KineNatsNextLog); with stdoutLogging it
// prints every line on stdout instead, as nats-server itself would.
type logger struct{ stdout bool }

func (l logger) line(level, format string, v []any) {
	msg := fmt.Sprintf(format, v...)
	if level == "F" {
		mu.Lock()
		fatal = msg
		mu.Unlock()
	}
	if l.stdout {
		fmt.Printf("%s [%s] %s\n", time.Now().Format("2006/01/02 15:04:05.000000"), map[string]string{"N": "INF", "W": "WRN", "E": "ERR", "F": "FTL", "D": "DBG"}[level], msg)
		return
	}
	if level == "N" || level == "D" {
		return
	}
	// Our readiness polling asks the health check; its failures are reported by kine-rs.
	if strings.HasPrefix(msg, "Healthcheck failed") {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	if logsClosed {
		return
	}
	select {
	case logs <- level + msg:
	default: // Rust is not keeping up: drop rather than block the server.
	}
}

func (l logger) Noticef(format string, v ...any) { l.line("N", format, v) }
func (l logger) Warnf(format string, v ...any)   { l.line("W", format, v) }
func (l logger) Fatalf(format string, v ...any)  { l.line("F", format, v) }
func (l logger) Errorf(format string, v ...any)  { l.line("E", format, v) }
func (l logger) Debugf(format string, v ...any)  {}
func (l logger) Tracef(format string, v ...any)  {}

func cstr(s string) *C.char { return C.CString(s) }

func hasAuth(o *server.Options) bool {
	return o.Authorization != "" || o.Username != "" || len(o.Users) > 0 || len(o.Nkeys) > 0 ||
		len(o.TrustedOperators) > 0 || len(o.TrustedKeys) > 0 || o.AuthCallout != nil || o.NoAuthUser != ""
}

func configure(req startOptions) (*server.Options, string, error) {
	opts := &server.Options{}
	if req.ConfigFile != "" {
		o, err := server.ProcessConfigFile(req.ConfigFile)
		if err != nil {
			return nil, "", fmt.Errorf("serverConfig %s: %w", req.ConfigFile, err)
		}
		opts = o
	}
	// kine-rs owns signals; nats-server must not install handlers (a second shutdown panics).
	opts.NoSigs = true
	opts.JetStream = true
	if req.ForceLoopback {
		opts.Host = "127.0.0.1"
		opts.Port = server.RANDOM_PORT
	} else {
		if req.Host != "" {
			opts.Host = req.Host
		} else if opts.Host == "" {
			opts.Host = "127.0.0.1"
		}
		if req.PortGiven {
			opts.Port = req.Port
		} else if opts.Port == 0 {
			opts.Port = server.RANDOM_PORT
		}
	}
	if req.StoreDir != "" {
		opts.StoreDir = req.StoreDir
	} else if opts.StoreDir == "" {
		opts.StoreDir = req.DefaultStoreDir
	}
	// Durability: fsync every message, or every interval (the URL's choice over the file's).
	if req.SyncAlways {
		opts.SyncAlways = true
		opts.SyncInterval = 2 * time.Minute
	} else if req.SyncIntervalMs > 0 {
		opts.SyncAlways = false
		opts.SyncInterval = time.Duration(req.SyncIntervalMs) * time.Millisecond
	}
	// Values as large as an etcd request may carry; a max_payload in the file wins.
	if req.MaxPayload > 0 && opts.MaxPayload == 0 {
		opts.MaxPayload = req.MaxPayload
	}
	source := "config"
	if !hasAuth(opts) {
		source = "url"
		switch {
		case req.User != "":
			opts.Username, opts.Password = req.User, req.Password
		case req.Token != "":
			opts.Authorization = req.Token
		default:
			return nil, "", errors.New("no client credentials for the embedded server")
		}
	}
	return opts, source, nil
}

//export KineNatsStart
func KineNatsStart(request *C.char) *C.char {
	var req startOptions
	if err := json.Unmarshal([]byte(C.GoString(request)), &req); err != nil {
		return cstr("bad start request: " + err.Error())
	}
	mu.Lock()
	defer mu.Unlock()
	if srv != nil || stopped {
		return cstr("an embedded NATS server was already started in this process")
	}
	opts, source, err := configure(req)
	if err != nil {
		return cstr(err.Error())
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return cstr(err.Error())
	}
	s.SetLogger(logger{stdout: req.StdoutLogging}, false, false)
	srv, srvOpts, authSource = s, opts, source
	go s.Start()
	startReturningIdleMemory()
	return nil
}

// KineNatsWaitReady waits up to timeoutMs for the server to accept clients with JetStream
// healthy. It returns NULL when ready, "wait:<reason>" when not ready yet, or
// "fail:<reason>" when the server cannot become ready (e.g. its port is taken).
//
//export KineNatsWaitReady
func KineNatsWaitReady(timeoutMs C.int) *C.char {
	mu.Lock()
	s := srv
	mu.Unlock()
	if s == nil {
		return cstr("fail:the embedded NATS server was not started")
	}
	deadline := time.Now().Add(time.Duration(timeoutMs) * time.Millisecond)
	reason := "not accepting connections yet"
	for {
		mu.Lock()
		f := fatal
		mu.Unlock()
		if f != "" {
			return cstr("fail:" + f)
		}
		if s.ReadyForConnections(5 * time.Millisecond) {
			rec := httptest.NewRecorder()
			s.HandleHealthz(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			if rec.Code == http.StatusOK {
				return nil
			}
			var health struct {
				Error string `json:"error"`
			}
			_ = json.Unmarshal(rec.Body.Bytes(), &health)
			reason = health.Error
			if reason == "" {
				reason = rec.Body.String()
			}
		}
		if time.Now().After(deadline) {
			return cstr("wait:" + reason)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

//export KineNatsInfo
func KineNatsInfo() *C.char {
	mu.Lock()
	s, o, source := srv, srvOpts, authSource
	mu.Unlock()
	if s == nil {
		return nil
	}
	opts := s.JetStreamConfig()
	info := serverInfo{ServerName: s.Name(), AuthSource: source}
	if opts != nil {
		info.StoreDir = opts.StoreDir
	}
	if tcp, ok := s.Addr().(*net.TCPAddr); ok {
		info.ListenPort = tcp.Port
		info.ListenHost = tcp.IP.String()
		host := info.ListenHost
		if tcp.IP.IsUnspecified() {
			if tcp.IP.To4() != nil {
				host = "127.0.0.1"
			} else {
				host = "::1"
			}
		}
		info.ClientURL = "nats://" + net.JoinHostPort(host, strconv.Itoa(tcp.Port))
	}
	if c := s.ClusterAddr(); c != nil {
		info.ClusterAddr = c.String()
		info.Cluster = s.ClusterName()
	}
	if o.LeafNode.Port != 0 {
		info.LeafAddr = net.JoinHostPort(o.LeafNode.Host, strconv.Itoa(o.LeafNode.Port))
	}
	info.Remotes = len(o.LeafNode.Remotes)
	info.SyncAlways, info.SyncMs = o.SyncAlways, o.SyncInterval.Milliseconds()
	info.MaxPayload = o.MaxPayload
	// The longest protocol line it takes (its default is filled in when the server starts).
	info.MaxControl = o.MaxControlLine
	out, _ := json.Marshal(info)
	return cstr(string(out))
}

// KineNatsAccountOf names the account of the client connection with id cid on the server
// with id serverID (both from the INFO the server sent that connection); NULL when this
// server is not serverID or knows no such connection.
//
//export KineNatsAccountOf
func KineNatsAccountOf(serverID *C.char, cid C.ulonglong) *C.char {
	mu.Lock()
	s := srv
	mu.Unlock()
	if s == nil || s.ID() != C.GoString(serverID) {
		return nil
	}
	connz, err := s.Connz(&server.ConnzOptions{CID: uint64(cid), Username: true})
	if err != nil || len(connz.Conns) != 1 || connz.Conns[0].Cid != uint64(cid) {
		return nil
	}
	// Connz leaves out the global account's name.
	if connz.Conns[0].Account == "" {
		return cstr(server.DEFAULT_GLOBAL_ACCOUNT)
	}
	return cstr(connz.Conns[0].Account)
}

// KineNatsStreamLastSeq returns the last sequence of stream in account as this server holds
// it, when this server may answer for the stream as its leader would (a server without a
// cluster holds its streams alone; in a cluster, only the stream's current leader); -1
// otherwise (not leader, no such stream here, server gone).
//
// In a cluster that number must also cover every message another replica may already have
// stored (and its kine-rs served): a follower stores an entry once it learns that the entry is
// committed, which can be before the leader's own apply goroutine stores it. So the answer
// waits for this leader to have applied everything committed when the question began: the
// first call (*commit == 0) notes the leader's Raft commit index in *commit, and while the
// leader has applied less than that, the call returns -2 (ask again in a moment, with the same
// *commit); then the stored last sequence is read, after.
//
// A leader cut off from the other replicas keeps believing it leads until its Raft term times
// out (10 to 20 s) while the others elect another leader and take writes, so *contactMs says
// how long ago this leader last heard from enough replicas to form a quorum with itself (the
// quorum's oldest contact, in milliseconds); -1 when the stream has no other replicas.
//
//export KineNatsStreamLastSeq
func KineNatsStreamLastSeq(account, stream *C.char, commit *C.ulonglong, contactMs *C.longlong) C.longlong {
	mu.Lock()
	s := srv
	mu.Unlock()
	*contactMs = -1
	if s == nil {
		return -1
	}
	acc, name := C.GoString(account), C.GoString(stream)
	clustered := s.JetStreamIsClustered()
	if clustered && !s.JetStreamIsStreamLeader(acc, name) {
		return -1
	}
	key := acc + "\x00" + name
	known, cached := groups.Load(key)
	group := ""
	if cached {
		group = known.(string)
	}
	if clustered && group != "" {
		switch applied(s, acc, group, (*uint64)(unsafe.Pointer(commit))) {
		case applyPending:
			return -2
		case applyUnknown:
			groups.Delete(key)
			return -1
		}
	}
	detail, err := s.JszAccount(&server.JSzOptions{Account: acc, Streams: true})
	if err != nil {
		return -1
	}
	for _, st := range detail.Streams {
		if st.Name != name {
			continue
		}
		if clustered && (st.Cluster == nil || st.Cluster.Leader != s.Name()) {
			return -1
		}
		replicated := st.Cluster != nil && len(st.Cluster.Replicas) > 0
		if clustered {
			// Only a stream with other replicas has followers that may store before the
			// leader: its Raft group is checked from the next call on (again after a change).
			want := ""
			if replicated {
				if st.Cluster.RaftGroup == "" {
					return -1
				}
				want = st.Cluster.RaftGroup
			}
			if !cached || want != group {
				groups.Store(key, want)
				if want != "" {
					return -2
				}
			}
		}
		if replicated {
			*contactMs = C.longlong(quorumContact(st.Cluster.Replicas).Milliseconds())
		}
		return C.longlong(st.State.LastSeq)
	}
	return -1
}

// groups holds the Raft group of each stream asked about ("account\x00stream" → group name;
// "" for a stream without other replicas, whose commits need no check).
var groups sync.Map

const (
	applyDone = iota
	applyPending
	applyUnknown
)

// applied says whether this server's member of Raft group has applied the entries up to
// *commit (its commit index, noted in *commit by the first call of a question).
func applied(s *server.Server, acc, group string, commit *uint64) int {
	status := s.Raftz(&server.RaftzOptions{AccountFilter: acc, GroupFilter: group})
	if status == nil {
		return applyUnknown
	}
	g, ok := (*status)[acc][group]
	if !ok {
		return applyUnknown
	}
	if *commit == 0 {
		*commit = g.Committed
	}
	if g.Applied < *commit {
		return applyPending
	}
	return applyDone
}

// quorumContact is how long ago the leader last heard from enough of its other replicas to
// form a quorum with itself: the oldest contact among the most recent ones it needs. A replica
// never heard from counts as never.
func quorumContact(replicas []*server.PeerInfo) time.Duration {
	never := time.Duration(math.MaxInt64)
	ages := make([]time.Duration, 0, len(replicas))
	for _, r := range replicas {
		switch {
		case r.Active > 0:
			ages = append(ages, r.Active)
		case r.Current:
			ages = append(ages, 0)
		default:
			ages = append(ages, never)
		}
	}
	sort.Slice(ages, func(i, j int) bool { return ages[i] < ages[j] })
	// Of the len+1 replicas (this leader included), a quorum needs (len+1)/2+1, so
	// (len+1)/2 others.
	return ages[(len(replicas)+1)/2-1]
}

// KineNatsNextLog returns the next warning or error line ("W..." / "E..." / "F..."), NULL
// after timeoutMs without one, or "" once the server is shut down and all lines are read.
//
//export KineNatsNextLog
func KineNatsNextLog(timeoutMs C.int) *C.char {
	select {
	case line, ok := <-logs:
		if !ok {
			return cstr("")
		}
		return cstr(line)
	case <-time.After(time.Duration(timeoutMs) * time.Millisecond):
		return nil
	}
}

// KineNatsShutdown stops the server and waits for it; calling it again does nothing.
//
//export KineNatsShutdown
func KineNatsShutdown() {
	mu.Lock()
	s := srv
	srv = nil
	stopped = true
	mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
	mu.Lock()
	if !logsClosed {
		logsClosed = true
		close(logs)
	}
	mu.Unlock()
}

//export KineNatsFree
func KineNatsFree(p *C.char) { C.free(unsafe.Pointer(p)) }

func main() {}
