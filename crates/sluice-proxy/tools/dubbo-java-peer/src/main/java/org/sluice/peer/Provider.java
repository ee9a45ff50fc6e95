package org.sluice.peer;

import org.apache.dubbo.config.ApplicationConfig;
import org.apache.dubbo.config.ProtocolConfig;
import org.apache.dubbo.config.RegistryConfig;
import org.apache.dubbo.config.ServiceConfig;
import org.apache.dubbo.config.bootstrap.DubboBootstrap;

/**
 * DemoService and TypesService (`-Dversion`, default 1.0.0; `-Dgroup`, default none) on `-Dport`, dubbo protocol +
 * hessian2. No registry unless `-Dregistry=zookeeper://127.0.0.1:2181` is given: then both register there (their
 * ephemeral nodes under /dubbo/{interface}/providers, `-Dregistry.session` ms of Zookeeper session). Dubbo refuses
 * to bind to 127.x (it binds every address instead), so the tests pass `-Dhost=::1`: loopback only. With
 * `-Dtriple.port`, the same services are also exported over Triple (Dubbo 3's HTTP/2 and HTTP/1 protocol) there.
 * With `-Dregister.mode=instance` it registers as Dubbo 3 application-level service discovery does instead: the
 * instance under /services/{application} (`-Dapp`, default sluice-java-peer), the interface -> application
 * mapping under /dubbo/mapping/{interface} and the application's metadata under
 * /dubbo/metadata/{application}/{revision} (metadata-type remote; `-Dmetadata.type=local` leaves it to the
 * instance's MetadataService).
 */
public class Provider {
    public static void main(String[] args) {
        int port = Integer.getInteger("port", 20880);
        ProtocolConfig proto = new ProtocolConfig("dubbo", port);
        proto.setHost(System.getProperty("host", "127.0.0.1"));
        proto.setSerialization("hessian2");
        // fastjson too: APISIX's http-dubbo sends it.
        proto.setPreferSerialization("hessian2,fastjson");
        proto.setThreads(Integer.getInteger("threads", 200));
        ApplicationConfig app = new ApplicationConfig(System.getProperty("app", "sluice-java-peer"));
        app.setQosEnable(false);
        boolean instance = "instance".equals(System.getProperty("register.mode", "interface"));
        String registry = System.getProperty("registry", RegistryConfig.NO_AVAILABLE);
        RegistryConfig reg = new RegistryConfig(registry);
        if (!RegistryConfig.NO_AVAILABLE.equals(registry)) {
            reg.setSession(Integer.getInteger("registry.session", 60000));
            reg.setUseAsConfigCenter(false);
            if (instance) {
                // Application-level only: the instance, the mapping and the metadata (in Zookeeper, not served
                // by the instance's MetadataService).
                reg.setRegisterMode("instance");
                reg.setUseAsMetadataCenter(true);
                // `-Dmetadata.type=local`: Dubbo's default, the metadata served by the instance's MetadataService only.
                app.setMetadataType(System.getProperty("metadata.type", "remote"));
            } else {
                // Interface-level registration only (/dubbo/{interface}/providers).
                reg.setRegisterMode("interface");
                reg.setUseAsMetadataCenter(false);
            }
        }
        java.util.List<ProtocolConfig> protocols = new java.util.ArrayList<>();
        protocols.add(proto);
        Integer triplePort = Integer.getInteger("triple.port");
        if (triplePort != null) {
            ProtocolConfig tri = new ProtocolConfig("tri", triplePort);
            tri.setHost(proto.getHost());
            protocols.add(tri);
        }
        DubboBootstrap.getInstance()
            .application(app)
            .registry(reg)
            .protocols(protocols)
            .service(service(DemoService.class, new DemoServiceImpl()))
            .service(service(TypesService.class, new TypesServiceImpl()))
            .start();
        System.out.println("READY " + port);
        System.out.flush();
        if (!Boolean.getBoolean("exit.with.stdin")) {
            DubboBootstrap.getInstance().await();
            return;
        }
        // The test that started us holds our stdin: when it ends (even killed), we end too.
        try {
            while (System.in.read() != -1) {
                // nothing is sent; only the end matters
            }
        } catch (java.io.IOException ignored) {
            // the parent is gone either way
        }
        // halt, not exit: Dubbo's shutdown hook would wait for in-flight calls, and a test provider keeps nothing.
        Runtime.getRuntime().halt(0);
    }

    private static <T> ServiceConfig<T> service(Class<T> iface, T impl) {
        ServiceConfig<T> svc = new ServiceConfig<>();
        svc.setInterface(iface);
        svc.setRef(impl);
        svc.setVersion(System.getProperty("version", "1.0.0"));
        String group = System.getProperty("group");
        if (group != null && !group.isEmpty()) {
            svc.setGroup(group);
        }
        return svc;
    }
}
