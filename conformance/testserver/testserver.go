// Package testserver is a drop-in replacement for the Kubernetes package
// k8s.io/apiserver/pkg/storage/etcd3/testserver.
//
// The upstream package starts an embedded etcd for every test. This one keeps
// the same exported API (NewTestConfig, RunEtcd) but starts a kine-rs process
// instead, so that the Kubernetes storage test suite can run unmodified
// against kine-rs: run.sh only rewrites the suite's import of the upstream
// package to this one.
//
// Configuration comes from the environment:
//
//	KINE_RS_BIN         path of the kine-rs binary (required)
//	KINE_RS_BACKEND     sqlite (default), memory, nats, nats-embedded, postgres, mysql or s3; see endpointFor
//	KINE_RS_NATS_URL    nats://host:port of the nats-server for KINE_RS_BACKEND=nats
//	KINE_RS_PG_URL      postgres://user:pass@host:port (no database) for KINE_RS_BACKEND=postgres
//	KINE_RS_MYSQL_URL   mysql://user:pass@tcp(host:port) (no database) for KINE_RS_BACKEND=mysql
//	KINE_RS_S3_URL      http://host:port of the S3-compatible server for KINE_RS_BACKEND=s3,
//	                    with KINE_RS_S3_ACCESS_KEY and KINE_RS_S3_SECRET_KEY
//	KINE_RS_LOG_DIR     optional directory that keeps one server log per test
//	                    (default: a per-test temporary directory)
//	KINE_RS_EXTRA_ARGS  optional extra command-line arguments, split on spaces
package testserver

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
)

const (
	// startTimeout bounds how long we wait for a freshly started server to
	// answer a real KV request.
	startTimeout = 60 * time.Second
	// stopTimeout is how long the server gets to exit after SIGTERM before
	// it is killed.
	stopTimeout = 10 * time.Second
	// maxLogBytes caps how much of a server log is echoed into the test
	// output when a test fails; the full file is kept in KINE_RS_LOG_DIR.
	maxLogBytes = 64 << 10
	// etcdDefaultProgressNotifyInterval is what etcd uses when the config
	// leaves the interval at zero. We pass it explicitly so kine-rs behaves
	// like the server the suite was written against, whatever its own
	// default is.
	etcdDefaultProgressNotifyInterval = 10 * time.Minute
)

// T is what the suite passes in: testing.TB up to k8s.io/apiserver v0.37, from v0.38 on an
// interface of its test server's with these methods (testing.TB has them all).
type T interface {
	Cleanup(func())
	Error(args ...any)
	Errorf(format string, args ...any)
	Fail()
	FailNow()
	Failed() bool
	Fatal(args ...any)
	Helper()
	Logf(format string, args ...any)
	Name() string
	TempDir() string
}

var _ T = &testing.T{}

// NewTestConfig returns the configuration RunEtcd will honour. Tests take it,
// change a few fields and pass it back to RunEtcd, so it has to be the real
// *embed.Config type. Only the fields listed in RunEtcd are honoured; all
// other fields are ignored because kine-rs has no equivalent.
func NewTestConfig(t T) *embed.Config {
	cfg := embed.NewConfig()

	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	// Tests (tls_test.go) switch the scheme of these URLs to https, so the
	// client listener has to be described here, as upstream does.
	clientURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.Dir = t.TempDir()
	return cfg
}

// autoPortLock serialises "pick a free port, start the server on it" when
// RunEtcd picks the port itself, which narrows the window in which two
// servers could be handed the same port.
var autoPortLock sync.Mutex

// RunEtcd starts a kine-rs server configured from cfg (or NewTestConfig(t)
// when cfg is nil) with a fresh, empty datastore, and returns a client
// connected to it. The server is stopped when the test ends.
//
// Honoured fields of cfg:
//   - ListenClientUrls[0]: host:port to listen on; scheme "https" enables TLS
//   - ClientTLSInfo: CertFile/KeyFile become the server certificate,
//     TrustedCAFile is required of clients when ClientCertAuth is set, and
//     the returned client uses the same TLS settings (as upstream does)
//   - WatchProgressNotifyInterval
//
// Among the fields the suite sets, QuotaBackendBytes (the cacher's
// initialisation benchmark raises it to 4 GiB) has no kine-rs equivalent:
// kine-rs enforces no backend quota, so it is ignored.
//
// The suite calls it in two ways: up to k8s.io/apiserver v0.37 with a config from
// NewTestConfig (nil for the defaults), from v0.38 on with functions that tweak the default
// config. opts takes either.
func RunEtcd(t T, opts ...any) *kubernetes.Client {
	t.Helper()

	var cfg *embed.Config
	var tweaks []func(*embed.Config)
	for _, opt := range opts {
		switch opt := opt.(type) {
		case nil:
		case *embed.Config:
			cfg = opt
		case func(*embed.Config):
			tweaks = append(tweaks, opt)
		default:
			t.Fatal(fmt.Sprintf("RunEtcd: an argument of type %T is neither a *embed.Config nor a func(*embed.Config)", opt))
		}
	}
	if cfg == nil {
		autoPortLock.Lock()
		defer autoPortLock.Unlock()
		cfg = NewTestConfig(t)
	}
	for _, tweak := range tweaks {
		tweak(cfg)
	}

	bin := os.Getenv("KINE_RS_BIN")
	if bin == "" {
		t.Fatal("KINE_RS_BIN is not set: it must name the kine-rs binary to test (run conformance/run.sh)")
	}
	if st, err := os.Stat(bin); err != nil || st.IsDir() {
		t.Fatal(fmt.Sprintf("KINE_RS_BIN=%q is not a file: %v", bin, err))
	}

	backend := os.Getenv("KINE_RS_BACKEND")
	if backend == "" {
		backend = "sqlite"
	}
	// A fresh directory per server, so that every test starts from an
	// empty datastore even if it reuses a config.
	endpoint, err := endpointFor(backend, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	backendArgs, err := argsFor(backend)
	if err != nil {
		t.Fatal(err)
	}

	if len(cfg.ListenClientUrls) == 0 {
		t.Fatal("config has no ListenClientUrls")
	}
	listen := cfg.ListenClientUrls[0]
	useTLS := listen.Scheme == "https"

	args := []string{
		"--endpoint", endpoint,
		"--listen-address", listen.Host,
		// Tests run servers side by side: none takes kine's default metrics port.
		"--metrics-bind-address", "0",
		"--watch-progress-notify-interval", formatDuration(progressNotifyInterval(cfg)),
	}
	args = append(args, backendArgs...)
	if useTLS {
		ti := cfg.ClientTLSInfo
		if ti.CertFile == "" || ti.KeyFile == "" {
			t.Fatal("https listener requested without ClientTLSInfo.CertFile/KeyFile")
		}
		args = append(args, "--server-cert-file", ti.CertFile, "--server-key-file", ti.KeyFile)
		if ti.ClientCertAuth && ti.TrustedCAFile != "" {
			args = append(args, "--trusted-ca-file", ti.TrustedCAFile)
		}
	}
	args = append(args, strings.Fields(os.Getenv("KINE_RS_EXTRA_ARGS"))...)

	logPath := logFilePath(t, listen.Host)
	srv, err := start(bin, args, logPath)
	if err != nil {
		t.Fatal(err)
	}
	// Registered before anything else can fail, so the process never
	// outlives the test. Cleanups run in reverse order: this one runs before
	// the removal of the temporary directories created above, so the log
	// file still exists when it is printed (for startup failures too).
	t.Cleanup(func() { srv.stop(t) })

	scheme := "http"
	var tlsConfig *tls.Config
	if useTLS {
		scheme = "https"
		if tlsConfig, err = cfg.ClientTLSInfo.ClientConfig(); err != nil {
			t.Fatal(err)
		}
	}
	clientURL := scheme + "://" + listen.Host

	if err := srv.waitListening(listen.Host, startTimeout); err != nil {
		t.Fatal(fmt.Sprintf("kine-rs did not start: %v", err))
	}

	client, err := kubernetes.New(clientv3.Config{
		TLS:         tlsConfig,
		Endpoints:   []string{clientURL},
		DialTimeout: 10 * time.Second,
		Logger:      zaptest.NewLogger(t, zaptest.Level(zapcore.ErrorLevel)).Named("etcd-client"),
	})
	if err != nil {
		t.Fatal(fmt.Sprintf("connecting to kine-rs at %s: %v", clientURL, err))
	}
	srv.client = client

	if err := srv.waitReady(client, startTimeout); err != nil {
		t.Fatal(fmt.Sprintf("kine-rs at %s is not serving: %v", clientURL, err))
	}
	srv.ready = true
	if backend == "s3" {
		startFollower(t, bin, args, listen.Hostname(), scheme, tlsConfig, clientURL)
	}

	// The suite inspects these recorders (e.g. to count reads, stream reads
	// and the lists made), exactly as with the upstream test server: the KV
	// recorder also records RangeStream lists (GetStream) in the Kubernetes
	// recorder.
	kubernetesRecorder := storagetesting.NewKubernetesRecorder(client.Kubernetes)
	client.KV = storagetesting.NewKVRecorder(client.KV, kubernetesRecorder)
	client.Kubernetes = kubernetesRecorder
	return client
}

// endpointFor maps a backend name to the kine-rs --endpoint for a fresh,
// empty datastore kept in dir.
func endpointFor(backend, dir string) (string, error) {
	switch backend {
	case "sqlite", "s3":
		// dir is absolute, so this reads sqlite:///abs/path/state.db.
		return "sqlite://" + filepath.Join(dir, "state.db"), nil
	case "memory":
		return "memory://", nil
	case "nats":
		// run.sh starts one nats-server for the run; every test gets a bucket of its own.
		natsURL := os.Getenv("KINE_RS_NATS_URL")
		if natsURL == "" {
			return "", fmt.Errorf("KINE_RS_BACKEND=nats needs KINE_RS_NATS_URL (run.sh starts a nats-server and sets it)")
		}
		bucketSeq++
		return fmt.Sprintf("%s?noEmbed&bucket=t%d-%d", natsURL, os.Getpid(), bucketSeq), nil
	case "nats-embedded":
		// Each kine-rs runs its own in-process nats-server (bare nats://), with
		// JetStream stored in the test's directory.
		return "nats://?dataDir=" + filepath.Join(dir, "nats"), nil
	case "postgres":
		// run.sh starts one PostgreSQL server for the run; every test gets a database
		// of its own (kine-rs creates it).
		pgURL := os.Getenv("KINE_RS_PG_URL")
		if pgURL == "" {
			return "", fmt.Errorf("KINE_RS_BACKEND=postgres needs KINE_RS_PG_URL (run.sh starts PostgreSQL and sets it)")
		}
		bucketSeq++
		return fmt.Sprintf("%s/t%d_%d?sslmode=disable", pgURL, os.Getpid(), bucketSeq), nil
	case "mysql":
		// Likewise one MariaDB server for the run and a database per test (kine-rs creates it);
		// t<pid>_<n> is a valid MySQL name (letters, digits, underscore; far below 64 characters).
		mysqlURL := os.Getenv("KINE_RS_MYSQL_URL")
		if mysqlURL == "" {
			return "", fmt.Errorf("KINE_RS_BACKEND=mysql needs KINE_RS_MYSQL_URL (run.sh starts MariaDB and sets it)")
		}
		bucketSeq++
		return fmt.Sprintf("%s/t%d_%d", mysqlURL, os.Getpid(), bucketSeq), nil
	default:
		return "", fmt.Errorf("unknown KINE_RS_BACKEND=%q (want sqlite, memory, nats, nats-embedded, postgres, mysql or s3)", backend)
	}
}

// argsFor gives the flags a backend needs beside --endpoint. s3: the SQLite
// database kept in S3 (run.sh starts one S3-compatible server for the run; every
// server gets a folder of its own), each write acknowledged once it is in S3; a
// second kine-rs follows it on the same folder (startFollower).
func argsFor(backend string) ([]string, error) {
	if backend != "s3" {
		return nil, nil
	}
	s3URL := os.Getenv("KINE_RS_S3_URL")
	if s3URL == "" {
		return nil, fmt.Errorf("KINE_RS_BACKEND=s3 needs KINE_RS_S3_URL (run.sh starts an S3 server and sets it)")
	}
	bucketSeq++
	return []string{
		"--s3-bucket", "kine", "--s3-folder", fmt.Sprintf("t%d-%d", os.Getpid(), bucketSeq),
		"--s3-endpoint", s3URL, "--s3-region", "us-east-1",
		"--s3-access-key", os.Getenv("KINE_RS_S3_ACCESS_KEY"), "--s3-secret-key", os.Getenv("KINE_RS_S3_SECRET_KEY"),
		"--s3-sync",
	}, nil
}

// bucketSeq numbers the NATS buckets and PostgreSQL/MySQL databases of one test binary (servers
// start one at a time).
var bucketSeq int

// progressNotifyInterval returns the interval etcd would use for cfg.
func progressNotifyInterval(cfg *embed.Config) time.Duration {
	// etcd 3.7 removed the deprecated ExperimentalWatchProgressNotifyInterval;
	// this is the only field left.
	if cfg.WatchProgressNotifyInterval > 0 {
		return cfg.WatchProgressNotifyInterval
	}
	return etcdDefaultProgressNotifyInterval
}

// formatDuration writes d as a single integer and unit ("600s", "100ms"),
// which every duration parser accepts, unlike Go's "10m0s".
func formatDuration(d time.Duration) string {
	switch {
	case d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	case d%time.Millisecond == 0:
		return fmt.Sprintf("%dms", d/time.Millisecond)
	default:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	}
}

// freePort asks the kernel for a free loopback port. Someone else may take
// it before the server binds it; the upstream test server has the same race.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("could not bind to a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

var unsafeFileChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// logFilePath names the file that receives the server's stdout and stderr.
func logFilePath(t T, hostPort string) string {
	dir := os.Getenv("KINE_RS_LOG_DIR")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	name := unsafeFileChars.ReplaceAllString(t.Name(), "_")
	if len(name) > 150 {
		name = name[:150]
	}
	_, port, _ := net.SplitHostPort(hostPort)
	return filepath.Join(dir, name+"-"+port+".log")
}

// server is one running kine-rs process.
type server struct {
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed when the process has exited
	waitErr error         // valid once exited is closed
	client  *kubernetes.Client
	ready   bool // it answered a request: from now on it must not exit
}

func start(bin string, args []string, logPath string) (*server, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logFile, "# %s %s\n", bin, strings.Join(args, " "))

	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	setProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	s := &server{cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		s.waitErr = cmd.Wait()
		logFile.Close()
		close(s.exited)
	}()
	return s, nil
}

func (s *server) hasExited() bool {
	select {
	case <-s.exited:
		return true
	default:
		return false
	}
}

// waitListening polls until the port accepts TCP connections. This is
// cheaper than letting gRPC back off between failed dials while the server
// starts, and notices at once if the process died.
func (s *server) waitListening(hostPort string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if s.hasExited() {
			return fmt.Errorf("process exited before listening on %s: %v", hostPort, s.waitErr)
		}
		conn, err := net.DialTimeout("tcp", hostPort, time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing listening on %s after %v: %w", hostPort, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitReady retries a real KV read until it succeeds: an open port does not
// yet mean that the datastore is usable.
func (s *server) waitReady(client *kubernetes.Client, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := client.KV.Get(ctx, "/kine-rs-conformance-readiness-probe")
		cancel()
		if err == nil {
			return nil
		}
		if s.hasExited() {
			return fmt.Errorf("process exited: %v (last request error: %v)", s.waitErr, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no successful Get after %v: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop closes the client, stops the process (SIGTERM, then SIGKILL after
// stopTimeout) and prints the server log if the test failed.
func (s *server) stop(t T) {
	if s.client != nil {
		s.client.Close()
	}
	if s.hasExited() {
		// The server must live as long as the test; dying early is a bug
		// (upstream reports embedded etcd errors the same way). A start-up
		// failure has already been reported.
		if s.ready {
			t.Errorf("kine-rs exited before the end of the test: %v", s.waitErr)
		}
	} else {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(stopTimeout):
			t.Logf("kine-rs did not exit %v after SIGTERM; killing it", stopTimeout)
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	if t.Failed() {
		t.Logf("kine-rs log (%s):\n%s", s.logPath, s.logTail())
	}
}

// logTail returns the end of the server log, at most maxLogBytes of it.
func (s *server) logTail() string {
	data, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read kine-rs log: %v)", err)
	}
	if len(data) > maxLogBytes {
		return fmt.Sprintf("(... first %d bytes cut, see the file)\n%s", len(data)-maxLogBytes, data[len(data)-maxLogBytes:])
	}
	return string(data)
}
