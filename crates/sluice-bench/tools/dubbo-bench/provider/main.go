// DemoService:1.0.0 hello(Map) -> Map over dubbo + hessian2 (dubbo-go 3.3.1), the provider of the `dubbo` bench
// scenario; binds 127.0.0.1 only. The same service as crates/sluice-proxy/tools/dubbo-go-peer, plus optional
// Zookeeper registration (interface- and application-level, metadata in Zookeeper), which Pixiu needs
// (see /work/shared/peers/pixiu.md, "Known problems" 3 and 4).
// usage: provider [port] [zk-address]
package main

import (
	"context"
	"fmt"
	"os"

	"dubbo.apache.org/dubbo-go/v3/config"
	_ "dubbo.apache.org/dubbo-go/v3/imports"
)

type DemoProvider struct{}

// Returns map[string]interface{}: dubbo-go v3.3.1's provider-side generic filter turns interface{}-typed map keys
// into "<interface {} Value>" for generic ($invoke) callers such as Pixiu and Sluice.
func (p *DemoProvider) Hello(ctx context.Context, req map[interface{}]interface{}) (map[string]interface{}, error) {
	body := "dubbo-go success\n"
	for k, v := range req {
		if b, ok := v.([]byte); ok {
			v = string(b)
		}
		body += fmt.Sprintf("%v: %v\n", k, v)
	}
	return map[string]interface{}{"status": "200", "body": body, "header1": "value1"}, nil
}

func (p *DemoProvider) Reference() string { return "DemoProvider" }

func (p *DemoProvider) MethodMapper() map[string]string { return map[string]string{"Hello": "hello"} }

func main() {
	port := "20881"
	if len(os.Args) > 1 {
		port = os.Args[1]
	}
	config.SetProviderService(&DemoProvider{})
	app := config.NewApplicationConfigBuilder().SetName("dubbo-go-demo")
	rb := config.NewRootConfigBuilder()
	pb := config.NewProviderConfigBuilder()
	if len(os.Args) > 2 {
		// metadata-type "remote": with "local" the MetadataService export binds ":<port>" and collides.
		app.SetMetadataType("remote")
		rb.AddRegistry("zk", config.NewRegistryConfigBuilder().SetProtocol("zookeeper").
			SetAddress(os.Args[2]).SetTimeout("5s").SetRegistryType("all").Build())
		pb.SetRegistryIDs("zk")
	}
	rc := rb.SetApplication(app.Build()).
		SetProvider(pb.
			AddService("DemoProvider", config.NewServiceConfigBuilder().
				SetInterface("org.apache.dubbo.backend.DemoService").
				SetProtocolIDs("dubbo").
				SetSerialization("hessian2").
				SetVersion("1.0.0").
				Build()).
			Build()).
		AddProtocol("dubbo", config.NewProtocolConfigBuilder().SetName("dubbo").SetIp("127.0.0.1").SetPort(port).Build()).
		Build()
	if err := config.Load(config.WithRootConfig(rc)); err != nil {
		panic(err)
	}
	select {}
}
