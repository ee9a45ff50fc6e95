// Direct baseline of the `dubbo` bench scenario: a dubbo-go 3.3.1 consumer making the same generic call as the
// gateways ($invoke of DemoService:1.0.0 hello(java.util.Map) with {"name":"tc"}) straight at the provider,
// from <concurrency> goroutines for <warm-up> then <seconds>; only the second part is counted.
// usage: client <provider-address> <concurrency> <warm-up seconds> <seconds>
// Prints MEASURING when the counted part starts, then one line: RESULT requests=N ok=N fail=N wall=S p50_us=N p99_us=N max_us=N cpu_s=S
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"dubbo.apache.org/dubbo-go/v3/config"
	"dubbo.apache.org/dubbo-go/v3/config/generic"
	_ "dubbo.apache.org/dubbo-go/v3/imports"
	hessian "github.com/apache/dubbo-go-hessian2"
)

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: client <host:port> <concurrency> <warm-up s> <seconds>")
		os.Exit(2)
	}
	addr, conc, warm, secs := os.Args[1], atoi(os.Args[2]), atof(os.Args[3]), atof(os.Args[4])
	ref := config.NewReferenceConfigBuilder().
		SetInterface("org.apache.dubbo.backend.DemoService").
		SetProtocol("dubbo").SetSerialization("hessian2").SetVersion("1.0.0").
		SetGeneric(true).SetURL("dubbo://" + addr).Build()
	rc := config.NewRootConfigBuilder().
		SetConsumer(config.NewConsumerConfigBuilder().SetRequestTimeout("5s").Build()).Build()
	if err := config.Load(config.WithRootConfig(rc)); err != nil {
		panic(err)
	}
	if err := ref.Init(rc); err != nil {
		panic(err)
	}
	ref.GenericLoad("DemoService")
	svc := config.GetConsumerService("DemoService")
	gs, ok := svc.(*generic.GenericService)
	if !ok {
		panic(fmt.Sprintf("no generic service: %T", svc))
	}
	call := func() error {
		arg := map[string]interface{}{"name": "tc"}
		out, err := gs.Invoke(context.Background(), "hello", []string{"java.util.Map"}, []hessian.Object{arg})
		if err != nil {
			return err
		}
		m, ok := out.(map[interface{}]interface{})
		if !ok || m["status"] != "200" {
			return fmt.Errorf("unexpected answer %v", out)
		}
		return nil
	}
	if err := call(); err != nil {
		fmt.Println("first call failed:", err)
		os.Exit(1)
	}
	var counting atomic.Bool
	var ok64, fail int64
	lat := make([][]time.Duration, conc)
	begin := time.Now()
	warmEnd := begin.Add(time.Duration(warm * float64(time.Second)))
	end := warmEnd.Add(time.Duration(secs * float64(time.Second)))
	var wg sync.WaitGroup
	for i := 0; i < conc; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for {
				t := time.Now()
				if !t.Before(end) {
					return
				}
				err := call()
				if !counting.Load() {
					continue
				}
				lat[i] = append(lat[i], time.Since(t))
				if err != nil {
					atomic.AddInt64(&fail, 1)
				} else {
					atomic.AddInt64(&ok64, 1)
				}
			}
		}(i)
	}
	time.Sleep(time.Until(warmEnd))
	cpu0 := cpu()
	start := time.Now()
	counting.Store(true)
	fmt.Println("MEASURING")
	wg.Wait()
	wall := time.Since(start)
	cpu1 := cpu()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	if len(all) == 0 {
		fmt.Println("no request completed")
		os.Exit(1)
	}
	sort.Slice(all, func(a, b int) bool { return all[a] < all[b] })
	pct := func(p float64) int64 { return all[int(p*float64(len(all)-1))].Microseconds() }
	fmt.Printf("RESULT requests=%d ok=%d fail=%d wall=%.3f p50_us=%d p99_us=%d max_us=%d cpu_s=%.3f\n",
		len(all), ok64, fail, wall.Seconds(), pct(0.50), pct(0.99), all[len(all)-1].Microseconds(), cpu1-cpu0)
	os.Exit(0)
}

// cpu is this process's user+system CPU seconds so far.
func cpu() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

func atof(s string) float64 { f, _ := strconv.ParseFloat(s, 64); return f }
