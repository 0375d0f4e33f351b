// SPDX-License-Identifier: BSD-3-Clause
/*
 * Test-only tc program: records the RX queue of UDP datagrams to pbox's data ports as if
 * a NIC's flow steering had put data port port_lo + k on queue k. Attached at tc ingress
 * of the bridge ports that face the workers (tests/netns/test_afxdp_netns.py), so that
 * when the bridge forwards a datagram to the appliance's multi-queue veth, the kernel's TX
 * queue choice (skb_tx_hash: the recorded RX queue) and with it the appliance's RX queue
 * is k: what `ethtool -N eth1 flow-type udp4 dst-port P action Q` does on a NIC. Other
 * traffic is left alone. port_lo and nports are pbox's defaults (a test-only program:
 * tc cannot set load-time constants).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define PORT_LO 7100
#define NPORTS  64

SEC("tc")
int pbox_steer(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct udphdr *udp;
	__u32 dport;

	if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) ||
	    ip->protocol != IPPROTO_UDP || ip->ihl != 5) {
		return TC_ACT_OK;
	}
	udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > end) {
		return TC_ACT_OK;
	}
	dport = bpf_ntohs(udp->dest);
	if (dport >= PORT_LO && dport < PORT_LO + NPORTS) {
		/* queue_mapping holds the recorded RX queue + 1 (skb_record_rx_queue). */
		skb->queue_mapping = dport - PORT_LO + 1;
	}
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
