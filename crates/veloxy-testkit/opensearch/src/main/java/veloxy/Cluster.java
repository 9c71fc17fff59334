package veloxy;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;

import org.codelibs.opensearch.runner.OpenSearchRunner;

/**
 * A real OpenSearch cluster of N nodes in this JVM, for veloxy's tests and benchmark.
 *
 * <p>Usage: {@code Cluster BASE_DIR NODES BASE_HTTP_PORT CLUSTER_NAME}. Node i (1..N) listens
 * for HTTP on 127.0.0.1:BASE_HTTP_PORT+i. Prints {@code READY port,port,...} once the cluster
 * is yellow, then reads commands on stdin, one per line, answering each with one line:
 * {@code stop I} (close node I: {@code STOPPED I}), {@code start I} (start it again:
 * {@code STARTED I}), {@code quit} or end of input (close every node and exit). I counts
 * from 1, as the ports do. Everything else the nodes print goes to stderr.
 */
public final class Cluster {
    private Cluster() {}

    public static void main(String[] args) throws Exception {
        String base = args[0];
        int nodes = Integer.parseInt(args[1]);
        int port = Integer.parseInt(args[2]);
        String name = args[3];
        OpenSearchRunner runner = new OpenSearchRunner();
        // The runner only takes ports in its own range unless told otherwise: a negative
        // maximum makes node i use exactly BASE_HTTP_PORT+i.
        runner.setMaxHttpPort(-1);
        runner.onBuild((number, settings) -> {
            settings.put("http.host", "127.0.0.1");
            settings.put("transport.host", "127.0.0.1");
            settings.put("http.cors.enabled", false);
            settings.put("cluster.routing.allocation.disk.threshold_enabled", false);
            settings.put("action.auto_create_index", true);
            // Node 1 alone is cluster-manager-eligible: stopping any other node never costs
            // the cluster its manager (two eligible nodes cannot elect one when either stops).
            if (number == 1) {
                settings.putList("node.roles", "cluster_manager", "data", "ingest");
            } else {
                settings.putList("node.roles", "data", "ingest");
            }
        });
        runner.build(OpenSearchRunner.newConfigs()
                .basePath(base)
                .numOfNode(nodes)
                .baseHttpPort(port)
                .clusterName(name)
                .disableESLogger());
        runner.ensureYellow();
        StringBuilder ports = new StringBuilder();
        for (int i = 0; i < runner.getNodeSize(); i++) {
            if (i > 0) {
                ports.append(',');
            }
            ports.append(runner.getNode(i).settings().get("http.port"));
        }
        System.out.println("READY " + ports);
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] cmd = line.trim().split("\\s+");
            if (cmd[0].equals("quit")) {
                break;
            }
            try {
                int i = Integer.parseInt(cmd[1]) - 1;
                if (cmd[0].equals("stop")) {
                    runner.getNode(i).close();
                    System.out.println("STOPPED " + (i + 1));
                } else if (cmd[0].equals("start")) {
                    runner.startNode(i);
                    runner.ensureYellow();
                    System.out.println("STARTED " + (i + 1));
                } else {
                    System.out.println("ERROR unknown command " + line);
                }
            } catch (Exception e) {
                System.out.println("ERROR " + e);
            }
            System.out.flush();
        }
        runner.close();
        runner.clean();
        System.exit(0);
    }
}
