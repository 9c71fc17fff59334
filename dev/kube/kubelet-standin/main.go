// kubelet-standin: what a kubelet does for the Gateway API conformance suite, without a
// container runtime (dev/gateway-conformance.sh runs it inside the test's network namespace).
//
// It registers one Node (Ready), binds every unscheduled Pod to it (there is no scheduler),
// and for each Pod bound to it: takes a free address from -pod-cidr, adds it to `lo`, writes
// the Pod's Secret and ConfigMap volumes under -dir, starts -echo-bin (the suite's echo-basic,
// built to listen on $VELOXY_POD_IP) with the container's env (literal values, fieldRefs,
// secret/configMap keys; paths under a volume's mountPath point at the written copy), waits
// until it accepts on its HTTP port, and reports the Pod Running and Ready with that podIP, so
// that kube-controller-manager's endpointslice controller publishes it. A container whose image
// is not echo-basic (the suite's coredns for UDP tests) is started as nothing and reported Ready
// all the same, so that the suite's setup (all Pods Ready) completes; its tests are skipped.
// A Pod being deleted has its process stopped, its address removed, and is deleted for good
// (grace 0), as a kubelet does after the containers stopped.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

var (
	kubeconfig = flag.String("kubeconfig", "", "kubeconfig of a user allowed to bind and update Pods")
	nodeName   = flag.String("node", "standin", "the Node to register and serve")
	nodeIP     = flag.String("node-ip", "192.0.2.1", "the Node's InternalIP (and every Pod's hostIP)")
	echoBin    = flag.String("echo-bin", "", "the echo-basic binary")
	podCIDR    = flag.String("pod-cidr", "198.51.100.0/24", "Pod addresses are taken from here (added to lo)")
	dir        = flag.String("dir", "/tmp/kubelet-standin", "volumes and logs of the Pods")
)

type running struct {
	uid  types.UID
	ip   netip.Addr
	cmd  *exec.Cmd
	done chan struct{}
}

type standin struct {
	c     *kubernetes.Clientset
	pods  cache.Indexer
	mu    sync.Mutex
	by    map[string]*running // ns/name -> what runs for it
	used  map[netip.Addr]bool
	pfx   netip.Prefix
	queue workqueue.TypedRateLimitingInterface[string]
}

func main() {
	flag.Parse()
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatalf("kubeconfig: %v", err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	c := kubernetes.NewForConfigOrDie(cfg)
	pfx, err := netip.ParsePrefix(*podCIDR)
	if err != nil {
		log.Fatalf("pod-cidr: %v", err)
	}
	s := &standin{c: c, by: map[string]*running{}, used: map[netip.Addr]bool{}, pfx: pfx,
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	ctx := context.Background()
	if err := s.registerNode(ctx); err != nil {
		log.Fatalf("registering node %s: %v", *nodeName, err)
	}
	lw := cache.NewListWatchFromClient(c.CoreV1().RESTClient(), "pods", "", fields.Everything())
	inf := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	enqueue := func(o any) {
		if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o); err == nil {
			s.queue.Add(k)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }, DeleteFunc: enqueue})
	s.pods = inf.GetIndexer()
	go inf.Run(ctx.Done())
	cache.WaitForCacheSync(ctx.Done(), inf.HasSynced)
	log.Printf("node %s registered; serving Pods from %s", *nodeName, pfx)
	for i := 0; i < 4; i++ {
		go s.work(ctx)
	}
	select {}
}

func (s *standin) registerNode(ctx context.Context) error {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: *nodeName,
		Labels: map[string]string{"kubernetes.io/hostname": *nodeName}}}
	got, err := s.c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = s.c.CoreV1().Nodes().Get(ctx, *nodeName, metav1.GetOptions{})
	}
	if err != nil {
		return err
	}
	now := metav1.Now()
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("256Gi"), corev1.ResourcePods: resource.MustParse("500")}
	got.Status = corev1.NodeStatus{Capacity: res, Allocatable: res,
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: *nodeIP}},
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}}
	_, err = s.c.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{})
	return err
}

func (s *standin) work(ctx context.Context) {
	for {
		k, quit := s.queue.Get()
		if quit {
			return
		}
		if err := s.sync(ctx, k); err != nil {
			log.Printf("%s: %v (retrying)", k, err)
			s.queue.AddRateLimited(k)
		} else {
			s.queue.Forget(k)
		}
		s.queue.Done(k)
	}
}

func (s *standin) sync(ctx context.Context, key string) error {
	o, exists, err := s.pods.GetByKey(key)
	if err != nil {
		return err
	}
	if !exists {
		s.stop(key, "")
		return nil
	}
	p := o.(*corev1.Pod)
	switch {
	case p.Spec.NodeName == "" && p.DeletionTimestamp == nil:
		b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID},
			Target: corev1.ObjectReference{Kind: "Node", Name: *nodeName}}
		err := s.c.CoreV1().Pods(p.Namespace).Bind(ctx, b, metav1.CreateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil // already bound, or gone
		}
		return err
	case p.Spec.NodeName != *nodeName:
		return nil
	case p.DeletionTimestamp != nil:
		s.stop(key, p.UID)
		grace := int64(0)
		err := s.c.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &p.UID}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	s.mu.Lock()
	r := s.by[key]
	s.mu.Unlock()
	if r != nil && r.uid != p.UID {
		s.stop(key, r.uid) // a new Pod of the same name
		r = nil
	}
	if r == nil {
		if r, err = s.start(ctx, p); err != nil {
			return err
		}
	}
	if p.Status.Phase == corev1.PodRunning && p.Status.PodIP == r.ip.String() {
		return nil
	}
	return s.reportReady(ctx, p, r.ip)
}

// alloc takes the lowest free address of the Pod range and puts it on lo.
func (s *standin) alloc() (netip.Addr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for a := s.pfx.Addr().Next(); s.pfx.Contains(a); a = a.Next() {
		if !s.used[a] && s.pfx.Contains(a.Next()) { // not the broadcast address
			out, err := exec.Command("ip", "addr", "replace", a.String()+"/32", "dev", "lo").CombinedOutput()
			if err != nil {
				return a, fmt.Errorf("ip addr add %s: %v: %s", a, err, out)
			}
			s.used[a] = true
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no free address in %s", s.pfx)
}

func (s *standin) start(ctx context.Context, p *corev1.Pod) (*running, error) {
	ip, err := s.alloc()
	if err != nil {
		return nil, err
	}
	r := &running{uid: p.UID, ip: ip, done: make(chan struct{})}
	fail := func(err error) (*running, error) {
		s.release(ip)
		return nil, err
	}
	if len(p.Spec.Containers) > 0 && strings.Contains(p.Spec.Containers[0].Image, "echo-basic") {
		ctr := p.Spec.Containers[0]
		root := filepath.Join(*dir, "pods", string(p.UID))
		mounts, err := s.writeVolumes(ctx, p, ctr, root)
		if err != nil {
			return fail(err)
		}
		env, err := s.env(ctx, p, ctr, ip, mounts)
		if err != nil {
			return fail(err)
		}
		logf, err := os.Create(filepath.Join(*dir, "pods", p.Namespace+"_"+p.Name+".log"))
		if err != nil {
			return fail(err)
		}
		cmd := exec.Command(*echoBin)
		cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			logf.Close()
			return fail(fmt.Errorf("starting %s: %v", *echoBin, err))
		}
		r.cmd = cmd
		go func() { _ = cmd.Wait(); logf.Close(); close(r.done) }()
		port := "3000"
		for _, e := range env {
			if v, ok := strings.CutPrefix(e, "HTTP_PORT="); ok && v != "" {
				port = v
			}
		}
		if !waitListening(net.JoinHostPort(ip.String(), port), r.done) {
			s.kill(r)
			return fail(fmt.Errorf("echo-basic did not listen on %s:%s (log in %s)", ip, port, *dir))
		}
	} else {
		close(r.done)
	}
	s.mu.Lock()
	s.by[p.Namespace+"/"+p.Name] = r
	s.mu.Unlock()
	log.Printf("%s/%s: %s started (%s)", p.Namespace, p.Name, ip, p.Spec.Containers[0].Image)
	return r, nil
}

func waitListening(addr string, done chan struct{}) bool {
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); {
		select {
		case <-done:
			return false
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// writeVolumes writes the container's Secret and ConfigMap mounts under root and returns
// mountPath -> the written directory.
func (s *standin) writeVolumes(ctx context.Context, p *corev1.Pod, ctr corev1.Container, root string) (map[string]string, error) {
	mounts := map[string]string{}
	for _, m := range ctr.VolumeMounts {
		for _, v := range p.Spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			var data map[string][]byte
			var items []corev1.KeyToPath
			switch {
			case v.Secret != nil:
				sec, err := s.c.CoreV1().Secrets(p.Namespace).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
				if err != nil {
					return nil, fmt.Errorf("secret volume %s: %v", v.Name, err)
				}
				data, items = sec.Data, v.Secret.Items
			case v.ConfigMap != nil:
				cm, err := s.c.CoreV1().ConfigMaps(p.Namespace).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
				if err != nil {
					return nil, fmt.Errorf("configMap volume %s: %v", v.Name, err)
				}
				data = map[string][]byte{}
				for k, val := range cm.Data {
					data[k] = []byte(val)
				}
				items = v.ConfigMap.Items
			default:
				continue
			}
			if len(items) == 0 {
				for k := range data {
					items = append(items, corev1.KeyToPath{Key: k, Path: k})
				}
			}
			d := filepath.Join(root, m.MountPath)
			for _, it := range items {
				f := filepath.Join(d, it.Path)
				if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
					return nil, err
				}
				if err := os.WriteFile(f, data[it.Key], 0o600); err != nil {
					return nil, err
				}
			}
			mounts[m.MountPath] = d
		}
	}
	return mounts, nil
}

// env is the container's environment; a value under a volume's mountPath is moved to the
// written copy. VELOXY_POD_IP tells echo-basic the address to listen on.
func (s *standin) env(ctx context.Context, p *corev1.Pod, ctr corev1.Container, ip netip.Addr, mounts map[string]string) ([]string, error) {
	out := []string{"PATH=/usr/bin:/bin", "VELOXY_POD_IP=" + ip.String()}
	for _, e := range ctr.Env {
		v := e.Value
		if f := e.ValueFrom; f != nil {
			switch {
			case f.FieldRef != nil:
				v = map[string]string{"metadata.name": p.Name, "metadata.namespace": p.Namespace,
					"metadata.uid": string(p.UID), "status.podIP": ip.String(), "spec.nodeName": *nodeName,
					"status.hostIP": *nodeIP, "spec.serviceAccountName": p.Spec.ServiceAccountName}[f.FieldRef.FieldPath]
			case f.SecretKeyRef != nil:
				sec, err := s.c.CoreV1().Secrets(p.Namespace).Get(ctx, f.SecretKeyRef.Name, metav1.GetOptions{})
				if err != nil {
					return nil, err
				}
				v = string(sec.Data[f.SecretKeyRef.Key])
			case f.ConfigMapKeyRef != nil:
				cm, err := s.c.CoreV1().ConfigMaps(p.Namespace).Get(ctx, f.ConfigMapKeyRef.Name, metav1.GetOptions{})
				if err != nil {
					return nil, err
				}
				v = cm.Data[f.ConfigMapKeyRef.Key]
			}
		}
		for mp, d := range mounts {
			if rest, ok := strings.CutPrefix(v, mp); ok && (rest == "" || rest[0] == '/') {
				v = d + rest
			}
		}
		out = append(out, e.Name+"="+v)
	}
	return out, nil
}

func (s *standin) reportReady(ctx context.Context, p *corev1.Pod, ip netip.Addr) error {
	now := metav1.Now()
	p = p.DeepCopy()
	cond := func(t corev1.PodConditionType) corev1.PodCondition {
		return corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now}
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.HostIP = *nodeIP
	p.Status.HostIPs = []corev1.HostIP{{IP: *nodeIP}}
	p.Status.PodIP = ip.String()
	p.Status.PodIPs = []corev1.PodIP{{IP: ip.String()}}
	p.Status.StartTime = &now
	p.Status.Conditions = []corev1.PodCondition{cond(corev1.PodScheduled), cond(corev1.PodInitialized),
		cond(corev1.ContainersReady), cond(corev1.PodReady)}
	p.Status.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: new(true),
			ContainerID: "standin://" + string(p.UID) + "/" + c.Name,
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}})
	}
	_, err := s.c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil // a newer version is queued, or the Pod is gone
	}
	return err
}

// stop ends what runs for key (only if it is of uid, when uid is given) and frees its address.
func (s *standin) stop(key string, uid types.UID) {
	s.mu.Lock()
	r := s.by[key]
	if r == nil || (uid != "" && r.uid != uid) {
		s.mu.Unlock()
		return
	}
	delete(s.by, key)
	s.mu.Unlock()
	s.kill(r)
	s.release(r.ip)
	log.Printf("%s: stopped, %s released", key, r.ip)
}

func (s *standin) kill(r *running) {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(2 * time.Second):
			_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
			<-r.done
		}
	}
}

func (s *standin) release(ip netip.Addr) {
	_ = exec.Command("ip", "addr", "del", ip.String()+"/32", "dev", "lo").Run()
	s.mu.Lock()
	delete(s.used, ip)
	s.mu.Unlock()
}
