// bbolt (go.etcd.io/bbolt, the store etcd keeps its data in) for kine-rs's etcd-format
// snapshots: Rust writes batches of records into a new bbolt file and reads buckets back page
// by page. A database is named by a handle (runtime/cgo). Errors come back as C strings that
// Rust frees with KineNatsFree; a panic inside bbolt (a damaged file) becomes an error too.
package main

/*
#include <stdlib.h>
#include <stdint.h>
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime/cgo"
	"runtime/debug"
	"time"
	"unsafe"

	bolt "go.etcd.io/bbolt"
)

// guard runs f and turns a panic, or a fault reading a damaged file's mapping, into an error.
func guard(f func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("bbolt: %v", r)
		}
	}()
	return f()
}

func errString(err error) *C.char {
	if err == nil {
		return nil
	}
	return cstr(err.Error())
}

func boltDB(h C.uintptr_t) *bolt.DB {
	return cgo.Handle(h).Value().(*bolt.DB)
}

// KineBoltOpen opens the bbolt file at path: a new file (which must not exist yet) when
// create is 1, an existing one read-only otherwise. It returns a handle, or 0 and *errOut.
//
//export KineBoltOpen
func KineBoltOpen(path *C.char, create C.int, errOut **C.char) C.uintptr_t {
	name := C.GoString(path)
	var db *bolt.DB
	err := guard(func() error {
		opts := &bolt.Options{Timeout: time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType}
		if create != 0 {
			// No freelist page, as etcd writes; no fsync: the file is a scratch copy, streamed
			// once and deleted.
			opts.NoSync, opts.NoGrowSync = true, true
			f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			f.Close()
		} else {
			opts.ReadOnly = true
		}
		var err error
		db, err = bolt.Open(name, 0o600, opts)
		return err
	})
	if err != nil {
		*errOut = errString(err)
		return 0
	}
	return C.uintptr_t(cgo.NewHandle(db))
}

// record splits the next `u32 len, bytes` field off data.
func field(data []byte) ([]byte, []byte, error) {
	if len(data) < 4 {
		return nil, nil, errors.New("truncated record")
	}
	n := binary.LittleEndian.Uint32(data)
	if uint64(len(data)-4) < uint64(n) {
		return nil, nil, errors.New("truncated record")
	}
	return data[4 : 4+n], data[4+n:], nil
}

// KineBoltPut writes a batch in one transaction: records `bucket, key, value`, each a
// little-endian u32 length and its bytes. A record with an empty key only creates its bucket.
// Keys given in order fill pages completely.
//
//export KineBoltPut
func KineBoltPut(h C.uintptr_t, buf *C.char, n C.size_t) *C.char {
	data := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
	return errString(guard(func() error {
		return boltDB(h).Update(func(tx *bolt.Tx) error {
			var bucket *bolt.Bucket
			var name []byte
			for len(data) > 0 {
				b, rest, err := field(data)
				if err != nil {
					return err
				}
				k, rest, err := field(rest)
				if err != nil {
					return err
				}
				v, rest, err := field(rest)
				if err != nil {
					return err
				}
				data = rest
				if bucket == nil || !bytes.Equal(b, name) {
					if bucket, err = tx.CreateBucketIfNotExists(b); err != nil {
						return fmt.Errorf("bucket %q: %w", b, err)
					}
					bucket.FillPercent = 1.0
					name = b
				}
				if len(k) > 0 {
					if err := bucket.Put(k, v); err != nil {
						return fmt.Errorf("bucket %q: %w", b, err)
					}
				}
			}
			return nil
		})
	}))
}

// KineBoltWriteTo writes a consistent copy of the database to the new file path (what etcd
// streams as a snapshot: exactly the pages in use). Not synced: the copy is streamed and
// deleted, never kept.
//
//export KineBoltWriteTo
func KineBoltWriteTo(h C.uintptr_t, path *C.char) *C.char {
	name := C.GoString(path)
	return errString(guard(func() error {
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		err = boltDB(h).View(func(tx *bolt.Tx) error {
			_, err := tx.WriteTo(f)
			return err
		})
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}))
}

// KineBoltScan reads one bucket (the top-level bucket names when blen is 0) from the first key
// after `after` (from the start when alen is 0) until about max bytes: records `key, value`
// as KineBoltPut takes them, in *out (malloc'd; Rust frees it) and *outLen. A top-level entry
// that is not a bucket is reported with the value "!". An empty result means the end.
//
//export KineBoltScan
func KineBoltScan(h C.uintptr_t, bucket *C.char, blen C.size_t, after *C.char, alen C.size_t, max C.size_t, out **C.char, outLen *C.size_t) *C.char {
	name := C.GoBytes(unsafe.Pointer(bucket), C.int(blen))
	from := C.GoBytes(unsafe.Pointer(after), C.int(alen))
	var res []byte
	err := guard(func() error {
		return boltDB(h).View(func(tx *bolt.Tx) error {
			var c *bolt.Cursor
			if len(name) == 0 {
				c = tx.Cursor()
			} else if b := tx.Bucket(name); b != nil {
				c = b.Cursor()
			} else {
				return fmt.Errorf("no bucket %q", name)
			}
			var k, v []byte
			if len(from) == 0 {
				k, v = c.First()
			} else if k, v = c.Seek(from); k != nil && bytes.Equal(k, from) {
				k, v = c.Next()
			}
			for ; k != nil && uint64(len(res)) < uint64(max); k, v = c.Next() {
				if len(name) == 0 {
					if v == nil {
						v = []byte{}
					} else {
						v = []byte("!")
					}
				} else if v == nil {
					return fmt.Errorf("bucket %q holds a nested bucket %q", name, k)
				}
				res = binary.LittleEndian.AppendUint32(res, uint32(len(k)))
				res = append(res, k...)
				res = binary.LittleEndian.AppendUint32(res, uint32(len(v)))
				res = append(res, v...)
			}
			return nil
		})
	})
	if err != nil {
		return errString(err)
	}
	*outLen = C.size_t(len(res))
	if len(res) > 0 {
		*out = (*C.char)(C.CBytes(res))
	}
	return nil
}

// KineBoltClose closes the database and frees its handle.
//
//export KineBoltClose
func KineBoltClose(h C.uintptr_t) *C.char {
	handle := cgo.Handle(h)
	db := handle.Value().(*bolt.DB)
	handle.Delete()
	return errString(guard(db.Close))
}
