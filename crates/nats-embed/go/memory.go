package main

import (
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// After a burst of writes the embedded server's garbage (message-block caches that expire a
// little later, request buffers) stays mapped until the Go runtime's next collection, and with
// nothing allocating that can be minutes away: 150 MiB more than the server uses once a bulk
// load is over. Every returnEvery, if no collection ran since the last look and the heap holds
// at least returnAbove bytes, a collection runs and the free memory goes back to the operating
// system. Under load the collector runs often and this stays out of the way; at rest it costs
// one collection every returnEvery (tens of milliseconds of CPU for a 100 MiB heap).
const (
	returnEvery = 30 * time.Second
	returnAbove = 32 << 20
)

var returnOnce sync.Once

func startReturningIdleMemory() {
	returnOnce.Do(func() { go returnIdleMemory() })
}

func returnIdleMemory() {
	samples := []metrics.Sample{
		{Name: "/gc/cycles/total:gc-cycles"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
	}
	var lastCycles uint64
	for range time.Tick(returnEvery) {
		metrics.Read(samples)
		cycles := samples[0].Value.Uint64()
		heap := samples[1].Value.Uint64() + samples[2].Value.Uint64()
		quiet := cycles == lastCycles
		lastCycles = cycles
		if quiet && heap >= returnAbove {
			debug.FreeOSMemory()
			metrics.Read(samples)
			lastCycles = samples[0].Value.Uint64()
		}
	}
}
