# Weights cache: an EFS file system the engine pods mount (a static PersistentVolume, the EFS
# CSI driver), so a replica's second cold start reads the weights (and Triton's compiled
# kernels) from it instead of re-streaming the model from S3 (loader/node_cache.py). The
# namespace's Pod Security "restricted" profile refuses hostPath, which rules out the nodes'
# own disks. A cache, not a store: no backups, and anything in it can be fetched again.

module "kms" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/kms/aws"
  version = "3.1.1"

  description             = "${var.name}: weights cache at rest"
  deletion_window_in_days = 30
  enable_key_rotation     = true
  aliases                 = ["${var.name}-weights-cache"]

  tags = var.tags
}

resource "aws_efs_file_system" "this" {
  #checkov:skip=CKV2_AWS_18:A cache of objects kept in S3 (versioned there); a backup would copy what S3 already holds.
  creation_token   = "${var.name}-weights-cache"
  encrypted        = true
  kms_key_id       = module.kms.key_arn
  performance_mode = "generalPurpose"
  # Elastic: reads scale with the load (many replicas cold-starting at once) and are billed
  # by the byte, so an idle cache costs its storage only.
  throughput_mode = "elastic"

  tags = merge(var.tags, { Name = "${var.name}-weights-cache" })
}

resource "aws_efs_backup_policy" "this" {
  file_system_id = aws_efs_file_system.this.id

  backup_policy {
    status = "DISABLED"
  }
}

resource "aws_security_group" "this" {
  name_prefix = "${var.name}-weights-cache-"
  description = "NFS to the weights cache from the EKS nodes"
  vpc_id      = var.vpc_id
  tags        = var.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "nfs_from_nodes" {
  security_group_id            = aws_security_group.this.id
  description                  = "NFS from the EKS nodes (the CSI driver mounts on the node)"
  referenced_security_group_id = var.client_security_group_id
  ip_protocol                  = "tcp"
  from_port                    = 2049
  to_port                      = 2049
}

resource "aws_efs_mount_target" "this" {
  for_each = toset(var.subnet_ids)

  file_system_id  = aws_efs_file_system.this.id
  subnet_id       = each.value
  security_groups = [aws_security_group.this.id]
}

# The pods run as uid/gid 10001 (infra/k8s/templates/_macros.j2) and a new file system's root
# belongs to root: the access point gives every engine pod one directory it owns, and maps its
# NFS calls to that user whatever the client claims.
resource "aws_efs_access_point" "engine" {
  file_system_id = aws_efs_file_system.this.id

  posix_user {
    uid = 10001
    gid = 10001
  }

  root_directory {
    path = "/loraplex"

    creation_info {
      owner_uid   = 10001
      owner_gid   = 10001
      permissions = "0750"
    }
  }

  tags = var.tags
}
