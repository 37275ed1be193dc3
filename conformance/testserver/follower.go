package testserver

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
)

// followerCatchUp bounds how long a follower may take, at the end of a test, to hold what
// the writer holds (it looks for new segments every second).
const followerCatchUp = 30 * time.Second

// startFollower starts, for KINE_RS_BACKEND=s3, a second kine-rs on the writer's S3 folder
// (args are the writer's, whose --endpoint and --listen-address it replaces): it serves a
// read-only copy of the writer's store for the whole test. When the test ends it must hold
// exactly what the writer holds (every key with its revisions and lease, at the writer's
// revision), and it must not have exited: the suite's workloads, run on the writer, are the
// follower's test too.
func startFollower(t T, bin string, args []string, host, scheme string, tlsConfig *tls.Config, writerURL string) {
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	hostPort := net.JoinHostPort(host, strconv.Itoa(port))
	followerArgs := append([]string(nil), args...)
	for i := 0; i+1 < len(followerArgs); i++ {
		switch followerArgs[i] {
		case "--endpoint":
			followerArgs[i+1] = "sqlite://" + filepath.Join(t.TempDir(), "state.db")
		case "--listen-address":
			followerArgs[i+1] = hostPort
		}
	}
	srv, err := start(bin, followerArgs, logFilePath(t, hostPort))
	if err != nil {
		t.Fatal(err)
	}
	url := scheme + "://" + hostPort
	if err := srv.waitListening(hostPort, startTimeout); err != nil {
		srv.stop(t)
		t.Fatal(fmt.Sprintf("the S3 follower did not start: %v", err))
	}
	client, err := kubernetes.New(clientv3.Config{TLS: tlsConfig, Endpoints: []string{url}, DialTimeout: 10 * time.Second})
	if err != nil {
		srv.stop(t)
		t.Fatal(fmt.Sprintf("connecting to the S3 follower at %s: %v", url, err))
	}
	srv.client = client
	if err := srv.waitReady(client, startTimeout); err != nil {
		srv.stop(t)
		t.Fatal(fmt.Sprintf("the S3 follower at %s is not serving: %v", url, err))
	}
	srv.ready = true
	// Cleanups run in reverse order: this one, registered after the writer's, runs first,
	// while the writer still serves.
	t.Cleanup(func() {
		if !srv.hasExited() {
			if err := sameAsWriter(client, writerURL, tlsConfig); err != nil {
				t.Errorf("the S3 follower at %s: %v", url, err)
			}
		}
		srv.stop(t)
	})
}

type version struct {
	Key                                  string
	Value                                string
	CreateRevision, ModRevision, Version int64
	Lease                                int64
}

// everything lists every key (at revision rev; 0: the newest) with what etcd keeps of it.
func everything(ctx context.Context, c *kubernetes.Client, rev int64) (int64, []version, error) {
	opts := []clientv3.OpOption{clientv3.WithFromKey()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := c.KV.Get(ctx, "\x00", opts...)
	if err != nil {
		return 0, nil, err
	}
	out := make([]version, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, version{string(kv.Key), string(kv.Value), kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease})
	}
	return resp.Header.Revision, out, nil
}

// sameAsWriter waits until the follower holds the writer's current revision, then compares
// their keys at it.
func sameAsWriter(follower *kubernetes.Client, writerURL string, tlsConfig *tls.Config) error {
	writer, err := kubernetes.New(clientv3.Config{TLS: tlsConfig, Endpoints: []string{writerURL}, DialTimeout: 10 * time.Second})
	if err != nil {
		return fmt.Errorf("connecting to the writer: %w", err)
	}
	defer writer.Close()
	ctx, cancel := context.WithTimeout(context.Background(), followerCatchUp)
	defer cancel()
	rev, want, err := everything(ctx, writer, 0)
	if err != nil {
		return fmt.Errorf("reading the writer: %w", err)
	}
	for {
		// A linearizable read: the follower first applies what S3 holds.
		got, _, err := everything(ctx, follower, 0)
		if err == nil && got >= rev {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("not at the writer's revision %d after %v (at %d, %v)", rev, followerCatchUp, got, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	_, got, err := everything(ctx, follower, rev)
	if err != nil {
		return fmt.Errorf("reading at revision %d: %w", rev, err)
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("at revision %d it holds %d keys, the writer %d, or they differ:\nfollower %v\nwriter   %v", rev, len(got), len(want), got, want)
	}
	return nil
}
