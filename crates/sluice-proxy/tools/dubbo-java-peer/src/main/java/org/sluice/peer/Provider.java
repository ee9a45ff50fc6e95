package org.sluice.peer;

import org.apache.dubbo.config.ApplicationConfig;
import org.apache.dubbo.config.ProtocolConfig;
import org.apache.dubbo.config.RegistryConfig;
import org.apache.dubbo.config.ServiceConfig;
import org.apache.dubbo.config.bootstrap.DubboBootstrap;

/**
 * DemoService and TypesService (version 1.0.0) on `-Dport`, dubbo protocol + hessian2, no registry. Dubbo refuses
 * to bind to 127.x (it binds every address instead), so the tests pass `-Dhost=::1`: loopback only.
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
        ApplicationConfig app = new ApplicationConfig("sluice-java-peer");
        app.setQosEnable(false);
        DubboBootstrap.getInstance()
            .application(app)
            .registry(new RegistryConfig(RegistryConfig.NO_AVAILABLE))
            .protocol(proto)
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
        svc.setVersion("1.0.0");
        return svc;
    }
}
