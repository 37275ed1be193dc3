package main

import (
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// After a burst of writes the embedded server's garbage (message-block caches, which expire 10 s
// after their last use, request buffers) stays mapped until the Go runtime's next collection,
// and with nothing allocating that can be minutes away: 100 MiB and more beyond what the server
// uses once a bulk load is over. So once no collection has run for checkEvery and the heap
// holds at least returnAbove bytes, a collection runs and the free memory goes back to the
// operating system; again 10, 20 and then every 30 s while things stay quiet (the caches expire
// after the first ones). Under load the collector runs often and this stays out of the way; at
// rest it costs one collection every 30 s (tens of milliseconds of CPU for a 100 MiB heap).
const (
	checkEvery  = 5 * time.Second
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
	maxGap := int(returnEvery / checkEvery)
	var lastCycles uint64
	// Looks since the collector last ran by itself, the look at which to return memory next,
	// and the looks between returns after that one.
	quiet, next, gap := 0, 1, 2
	for range time.Tick(checkEvery) {
		metrics.Read(samples)
		cycles := samples[0].Value.Uint64()
		heap := samples[1].Value.Uint64() + samples[2].Value.Uint64()
		if cycles != lastCycles {
			lastCycles = cycles
			quiet, next, gap = 0, 1, 2
			continue
		}
		quiet++
		if quiet < next {
			continue
		}
		if heap >= returnAbove {
			debug.FreeOSMemory()
			metrics.Read(samples)
			lastCycles = samples[0].Value.Uint64()
		}
		next, gap = quiet+gap, min(2*gap, maxGap)
	}
}
